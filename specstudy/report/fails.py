"""When speculation does not pay (the seed's FAQ Q4): large batch, α < 0.4, short outputs, memory.

Each function measures one case from the records where they allow it and puts the cost model's
prediction beside it, labelled as a prediction.  Tables are DataFrames; prediction statements
are plain strings for the report to print.  The ``*_claims`` functions put each case's measured
rows against the seed's expectation in words decided from the intervals (:mod:`specstudy.analysis.claims`): the
section and the summary print the same sentences, so neither can say more than the table shows.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from .. import costmodel
from ..analysis import claims
from ..analysis.claims import Direction, Estimate
from ..analysis.format import fmt, fmt_ci, short_model
from ..analysis.memory import memory_groups
from ..analysis.rows import headline_max_new
from ..analysis.stats import NAN, Pooled, break_even_alpha, isnum, pooled, predicted_for
from ..analysis.study import Study
from ..config.vocab import cost_dtype
from ..costmodel import HardwareProfile
from . import wording
from .wording import estimate_text


def _cm_dtype(study: Study, target: str) -> str:
    """The cost model's weight format of a target: its quantization, else its dtype."""
    pair = study.model_pair(target)
    if pair is None:
        return "bf16"
    return cost_dtype(pair.get("dtype", "bf16"), pair.get("quantization", "none"))


def _spec_all(study: Study) -> list[str]:
    return [c for c in study.records if study.meta(c)["method"] != "ar"]


def _name(label: str, gamma: int | None, synthetic: str | None = None) -> str:
    """A row's method name: label and γ, marked where its acceptance was fixed for timing."""
    name = f"{label} γ={gamma}" if gamma else str(label)
    return f"{name} (synthetic acceptance {synthetic})" if synthetic else name


BatchKey = tuple[str, str, Any, str, Any]  # framework, label, γ, sampling, synthetic rule


def batch_groups(study: Study) -> dict[BatchKey, dict[int, list[str]]]:
    """Speculative cells at the headline length, by method row and batch size, for rows run at several sizes.

    Only tasks measured at several batch sizes count, so every batch row of a method has the same
    prompt mix; sampling and synthetic acceptance split rows (a greedy row is never pooled with T > 0).
    """
    mnt = headline_max_new(study)
    spec_all = [c for c in _spec_all(study) if study.meta(c)["max_new_tokens"] == mnt]

    def key(c: str) -> BatchKey:
        m = study.meta(c)
        return (m["framework"], m["label"], m["gamma"], m["sampling"], m["synthetic"])

    by_task: dict[tuple[BatchKey, str], set[int]] = {}
    for c in spec_all:
        by_task.setdefault((key(c), study.meta(c)["task"]), set()).add(study.meta(c)["batch_size"])
    groups: dict[BatchKey, dict[int, list[str]]] = {}
    for c in spec_all:
        m = study.meta(c)
        if len(by_task[(key(c), m["task"])]) >= 2:
            groups.setdefault(key(c), {}).setdefault(m["batch_size"], []).append(c)
    order = sorted(groups, key=lambda k: (k[0], k[1], k[2] or 0, k[3], k[4] or ""))
    return {k: groups[k] for k in order if len(groups[k]) >= 2}


def large_batch(study: Study) -> pd.DataFrame:
    """Speedup per batch size (measured) beside the cost model's, for methods run at several batch sizes.

    The prediction uses the study's measured α̂, c and verification cost at that batch size; only a
    row without measured step costs falls back to the roofline of the study's profile (said per row).
    """
    prof, params = study.profile, study.model_params()
    rows = []
    for (fw, label, g, sampling, synth), by_b in batch_groups(study).items():
        for b in sorted(by_b):
            p = pooled(study, by_b[b])
            # the study's own step costs at this batch size where it measured them; the roofline otherwise
            pred, costs = predicted_for(p, g), "measured"
            tgt = study.meta(by_b[b][0])["model"]
            if not isnum(pred) and prof is not None and tgt in params and isnum(p.alpha_hat):
                costs = f"roofline ({prof.name})"
                dr = study.meta(by_b[b][0])["drafter"]
                pr = costmodel.predict(
                    prof,
                    params[tgt],
                    params.get(dr) if dr else None,
                    min(p.alpha_hat, 1.0),
                    _cm_dtype(study, tgt),
                    b,
                    g,
                    c=p.c if isnum(p.c) else None,
                )
                pred = pr.speedup
            rows.append(
                {
                    "Method": _name(label, g, synth),
                    "Framework": fw,
                    "Sampling": sampling,
                    "Batch": b,
                    "Speedup (measured)": fmt_ci(p.speedup, p.speedup_ci, 2, "×", n=p.n_prompts),
                    "Speedup (cost model, prediction)": fmt(pred, 2, "×"),
                    "measured/predicted": fmt(p.speedup / pred if isnum(pred) and pred > 0 else NAN),
                    "costs": costs if isnum(pred) else "—",
                    "n (prompts)": p.n_prompts,
                    "repeats": p.n_repeats,
                }
            )
    return pd.DataFrame(rows)


def _compare_clause(a: Estimate, b: Estimate, expect: Direction) -> str:
    """``1.39× [..] vs 1.03× [..]``'s verdict: from the two intervals (the row without one names its n)."""
    v = claims.compare(a, b, expect)
    few = a if not a.has_interval else b
    return wording.phrase(v, rows=2, n=few.n)


def batch_claims(study: Study) -> list[str]:
    """FAQ Q4 (1) per method row: the speedup at each larger batch against the smallest, from the intervals."""
    out = []
    for (fw, label, g, sampling, synth), by_b in batch_groups(study).items():
        est = {b: Estimate.of(pooled(study, cs), "speedup") for b, cs in sorted(by_b.items())}
        b0, *larger = sorted(est)
        clauses = [
            f"batch {b} gave {estimate_text(est[b])} vs {estimate_text(est[b0])} at batch {b0}: "
            + _compare_clause(est[b], est[b0], "below")
            for b in larger
        ]
        top = est[max(est)]
        out.append(
            f"{_name(label, g, synth)} ({fw}, {sampling}): the seed expects the speedup to fall as batch × (γ + 1) "
            f"grows and verification turns compute-bound; here {'; '.join(clauses)}. At batch {max(est)}, the "
            f"largest measured: {wording.versus(top)}"
        )
    return out


def per_cell_acceptance(study: Study) -> pd.DataFrame:
    """One row per speculative cell at batch 1: α, speedup (with its interval and n), c, verification cost, α̂."""
    mnt = headline_max_new(study)
    rows = []
    for c in _spec_all(study):
        m = study.meta(c)
        if m["batch_size"] != 1 or m["max_new_tokens"] != mnt:
            continue
        p = pooled(study, [c])
        if isnum(p.alpha) and isnum(p.speedup):
            rows.append(
                {
                    "cell": c,
                    "label": m["label"],
                    "task": m["task"],
                    "gamma": m["gamma"],
                    "alpha": p.alpha,
                    "speedup": p.speedup,
                    "speedup_ci": p.speedup_ci,
                    "n_prompts": p.n_prompts,
                    "c": p.c,
                    "verify_ratio": p.verify_ratio,
                    "alpha_hat": p.alpha_hat,
                }
            )
    return pd.DataFrame(rows)


def _by_interval(part: pd.DataFrame) -> dict[str, int]:
    """How many cells' speedup intervals lie below 1, contain it, lie above it, or are missing (n too small)."""
    sides = [claims.side(Estimate(r["speedup"], r["speedup_ci"], int(r["n_prompts"])), 1.0) for _, r in part.iterrows()]
    return {k: sides.count(k) for k in ("below", "contains", "above", claims.N_TOO_SMALL)}


def low_alpha(study: Study, per_cell: pd.DataFrame) -> pd.DataFrame:
    """Cells with α < 0.4 against the rest: pooled α, speedup, and how many cells lost by their own interval."""
    lo, hi = per_cell[per_cell["alpha"] < 0.4], per_cell[per_cell["alpha"] >= 0.4]
    tab = []
    for name, part in (("α < 0.4", lo), ("α ≥ 0.4", hi)):
        cells = part["cell"].tolist()
        p = pooled(study, cells) if cells else Pooled()
        k = _by_interval(part)
        tab.append(
            {
                "Cells": name,
                "cells (n)": len(cells),
                "α pooled": fmt_ci(p.alpha, p.alpha_ci, n=p.n_prompts),
                "Speedup (measured)": fmt_ci(p.speedup, p.speedup_ci, 2, "×", n=p.n_prompts),
                "cells slower / cannot tell / faster than AR (own interval) / n too small": (
                    f"{k['below']} / {k['contains']} / {k['above']} / {k[claims.N_TOO_SMALL]}"
                ),
                "n (prompts)": p.n_prompts,
                "repeats": p.n_repeats,
            }
        )
    return pd.DataFrame(tab)


def low_alpha_claims(study: Study, per_cell: pd.DataFrame) -> list[str]:
    """FAQ Q4 (2): do the cells with α < 0.4 lose, pooled and cell by cell, and do they do worse than the rest?"""
    if not len(per_cell):
        return []
    lo, hi = per_cell[per_cell["alpha"] < 0.4], per_cell[per_cell["alpha"] >= 0.4]
    if not len(lo):
        return [
            f"No speculative cell at batch 1 had α < 0.4 (lowest α {per_cell['alpha'].min():.2f} of "
            f"{len(per_cell)} cells): this study has no row to test the seed's expectation that such cells lose"
        ]
    e = Estimate.of(pooled(study, lo["cell"].tolist()), "speedup")
    k = _by_interval(lo)
    text = (
        f"the seed expects cells with α < 0.4 to run slower than AR; here the {len(lo)} such cells pooled gave "
        f"{estimate_text(e)} over {e.n} prompts: {wording.phrase(claims.verdict(e, 1.0, 'below'), n=e.n)}. Cell by cell "
        f"(each by its own interval): {k['below']} slower than AR, {k['contains']} not resolvable, "
        f"{k['above']} faster, {k[claims.N_TOO_SMALL]} n too small"
    )
    if len(hi):
        eh = Estimate.of(pooled(study, hi["cell"].tolist()), "speedup")
        text += (
            f". Against the {len(hi)} cells with α ≥ 0.4 ({estimate_text(eh)}), the seed expects the low-α cells slower: "
            + _compare_clause(e, eh, "below")
        )
    return [text]


def low_alpha_predictions(per_cell: pd.DataFrame) -> list[str]:
    """Per method: the α̂ below which the cost model says every γ loses, at its measured costs."""
    preds = []
    for label, g in per_cell.groupby("label"):
        cs, vr = g["c"].dropna(), g["verify_ratio"].dropna()
        if len(cs) and len(vr):
            c_med, v_med = float(cs.median()), float(vr.median())
            preds.append(
                f"- {label}: measured c = {c_med:.3f}, verification cost {v_med:.2f}×T1 → speculation "
                f"loses for every γ when α̂ < {fmt(break_even_alpha(c_med, v_med))}"
            )
    return preds


ShortKey = tuple[str, str, Any, str, Any, int]  # framework, label, γ, sampling, synthetic rule, max_new_tokens


def short_groups(study: Study) -> list[tuple[ShortKey, list[str], list[str]]]:
    """Short-output rows (≤ 10 tokens, batch 1) and the same method's cells at the headline length.

    The long cells are the same framework, label, γ, sampling and tasks at batch 1, so the two rows
    differ in output length only.
    """
    mnt = headline_max_new(study)
    spec_all = [c for c in _spec_all(study) if study.meta(c)["batch_size"] == 1]
    groups: dict[ShortKey, list[str]] = {}
    for c in spec_all:
        m = study.meta(c)
        n = m["max_new_tokens"] or 99
        if n <= 10 and n < (mnt or 0):
            groups.setdefault((m["framework"], m["label"], m["gamma"], m["sampling"], m["synthetic"], n), []).append(c)
    out = []
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2] or 0, k[3], k[4] or "", k[5])):
        fw, label, g, sampling, synth, _ = key
        tasks = {study.meta(c)["task"] for c in groups[key]}
        longc = [
            c
            for c in spec_all
            if (study.meta(c)["framework"], study.meta(c)["label"], study.meta(c)["gamma"]) == (fw, label, g)
            and (study.meta(c)["sampling"], study.meta(c)["synthetic"]) == (sampling, synth)
            and study.meta(c)["max_new_tokens"] == mnt
            and study.meta(c)["task"] in tasks
        ]
        out.append((key, groups[key], longc))
    return out


def short_outputs(study: Study) -> pd.DataFrame:
    """Short-output cells (≤ 10 tokens) beside the same method at the headline length."""
    mnt = headline_max_new(study)
    tab = []
    for (fw, label, g, sampling, synth, n), cs, longc in short_groups(study):
        ps = pooled(study, cs)
        pl = pooled(study, longc) if longc else Pooled()
        tab.append(
            {
                "Method": _name(label, g, synth),
                "max_new_tokens": n,
                "Framework": fw,
                "Sampling": sampling,
                "Speedup short (measured)": fmt_ci(ps.speedup, ps.speedup_ci, 2, "×", n=ps.n_prompts),
                "AR's TTFT share of E2E (short)": fmt(ps.prefill_share),
                f"Speedup at {mnt} tokens (measured)": fmt_ci(pl.speedup, pl.speedup_ci, 2, "×", n=pl.n_prompts),
                "n (prompts)": ps.n_prompts,
            }
        )
    return pd.DataFrame(tab)


def short_claims(study: Study) -> list[str]:
    """FAQ Q4 (3) per method row: the short-output speedup against the same method's at the headline length."""
    mnt = headline_max_new(study)
    out = []
    for (fw, label, g, sampling, synth, n), cs, longc in short_groups(study):
        es = Estimate.of(pooled(study, cs), "speedup")
        head = (
            f"{_name(label, g, synth)} ({fw}, {sampling}): the seed expects less speedup with ≤ 10 output tokens "
            f"(the prefill and first token are the same work either way); here {n} tokens gave {estimate_text(es)}"
        )
        if not longc:
            out.append(f"{head}, and the study has no row of this method at {mnt} tokens to compare it with")
            continue
        el = Estimate.of(pooled(study, longc), "speedup")
        out.append(f"{head} vs {estimate_text(el)} at {mnt}: {_compare_clause(es, el, 'below')}")
    return out


def predicted_break_even(study: Study, prof: HardwareProfile | None) -> list[str]:
    """Prediction: the roofline's break-even batch for each configured pair."""
    if prof is None:
        return []
    params, lines = study.model_params(), []
    for pair in study.config.get("models", []):
        tgt = pair.get("target")
        if tgt not in params:
            continue
        dt = _cm_dtype(study, tgt)
        for mid in (pair.get("drafters") or {}).values():
            if mid not in params:
                continue
            c = costmodel.step_time(params[mid], prof, dt) / costmodel.step_time(params[tgt], prof, dt)
            for a in (0.6, 0.8):
                g, _ = costmodel.optimal_gamma(a, c)
                be = costmodel.break_even_batch(prof, params[tgt], params[mid], a, g, dt)
                lines.append(
                    f"- {short_model(tgt)} + {short_model(mid)}, α={a}, γ={g}: break-even batch {be if be else '> 4096'}"
                )
    return lines


def _fit_line(
    pair: dict[str, Any], prof: HardwareProfile, tgt: str, mid: str, params: dict[str, float], dt: str
) -> str:
    d_dt = cost_dtype(pair.get("dtype", "bf16"))
    tp = int(pair.get("tensor_parallel_size") or 1)
    cap = prof.memory_gb * tp
    t_gb = params[tgt] * costmodel.dtype_bytes(dt) / 1e9
    d_gb = params[mid] * costmodel.dtype_bytes(d_dt) / 1e9
    fits = t_gb + d_gb <= 0.9 * cap
    n_min = 1
    while t_gb + d_gb > 0.9 * n_min * prof.memory_gb and n_min < 64:
        n_min *= 2
    return (
        f"- {short_model(tgt)} ({t_gb:.1f} GB {dt}) + {short_model(mid)} ({d_gb:.2f} GB) on "
        f"{tp}× {prof.memory_gb:.0f} GB: {'fits' if fits else 'does NOT fit'} with 10 % headroom "
        f"(needs ≥ {n_min} GPU{'s' if n_min > 1 else ''}; the target alone "
        f"{costmodel.min_gpus(params[tgt], dt, prof)})"
        + ("" if fits else f"; the target would need ≤ {8 * (0.9 * cap - d_gb) * 1e9 / params[tgt]:.1f} bits/weight")
    )


def predicted_memory_fit(study: Study, prof: HardwareProfile | None) -> list[str]:
    """Prediction: does target + draft fit the profile's memory, and what the target would need to give up."""
    if prof is None:
        return []
    params, lines = study.model_params(), []
    for pair in study.config.get("models", []):
        tgt = pair.get("target")
        if tgt not in params:
            continue
        dt = _cm_dtype(study, tgt)
        for mid in (pair.get("drafters") or {}).values():
            if mid in params:
                lines.append(_fit_line(pair, prof, tgt, mid, params, dt))
    return lines


def claims_markdown(claims: list[str]) -> str:
    """A case's claims as markdown, each decided from the table's intervals (observed, reversed, cannot tell)."""
    return (
        "\nAgainst the seed, in this study:\n\n" + "\n".join(f"- {c[:1].upper()}{c[1:]}." for c in claims) + "\n"
        if claims
        else ""
    )


def memory_overhead(study: Study) -> tuple[pd.DataFrame, list[str]]:
    """Largest measured peak-memory overhead per method, read against the measurement's noise, and the sources."""
    groups = memory_groups(study)
    if not groups:
        return pd.DataFrame(), []
    md = pd.DataFrame(
        [
            {
                "Method": g.label,
                "Framework": g.framework,
                "Memory overhead (measured, largest over cells)": wording.memory_text(g.overhead, g.noise, g.source),
                "noise (MB)": fmt(g.noise / 1e6, 1),
                "cells": g.cells,
            }
            for g in groups
        ]
    )
    src = sorted({r.memory_source for r in study.all_records() if r.memory_source})
    return md, src


def memory_claims(study: Study) -> list[str]:
    """FAQ Q4 (4) per method: a draft model (or heads) should cost memory; n-grams and own layers should not."""
    out = []
    for g in memory_groups(study):
        v = g.verdict
        head = f"{g.label} ({g.framework}): {wording.memory_text(g.overhead, g.noise, g.source)}"
        if g.expects:
            out.append(f"{head}; the seed expects a draft model or heads to cost memory: {wording.phrase(v)}")
        elif v == claims.CANNOT_TELL:
            out.append(f"{head}, as the seed expects of a method without a draft model (within the noise)")
        elif v == claims.OBSERVED:
            out.append(f"{head}: more than the seed expects of a method without a draft model")
        else:
            out.append(head)
    return out
