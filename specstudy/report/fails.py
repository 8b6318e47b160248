"""When speculation does not pay (the seed's FAQ Q4): large batch, α < 0.4, short outputs, memory.

Each function measures one case from the records where they allow it and puts the cost model's
prediction beside it, labelled as a prediction.  Tables are DataFrames; prediction statements
are plain strings for the report to print.  The ``*_claims`` functions put each case's measured
rows against the seed's expectation in words decided from the intervals (:mod:`specstudy.analysis.claims`): the
section and the summary print the same sentences, so neither can say more than the table shows.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd

from .. import costmodel
from ..analysis import claims
from ..analysis.claims import Direction, Estimate
from ..analysis.faq import BatchCase, batch_cases, short_cases
from ..analysis.memory import memory_groups
from ..analysis.rows import headline_max_new
from ..analysis.stats import NAN, Pooled, break_even_alpha, isnum, pooled, predicted_for
from ..analysis.study_records import Study
from ..config.vocab import cost_dtype
from ..costmodel import HardwareProfile
from . import wording
from .format import fmt, fmt_ci, sampling_text, short_model
from .wording import estimate_text


def _cm_dtype(study: Study, target: str) -> str:
    """The cost model's weight format of a target: its quantization, else its dtype."""
    pair = study.model_pair(target)
    if pair is None:
        return "bf16"
    return cost_dtype(pair.get("dtype", "bf16"), pair.get("quantization", "none"))


def _name(label: str, gamma: int | None, synthetic: str | None = None) -> str:
    """A row's method name: label and γ, marked where its acceptance was fixed for timing."""
    name = f"{label} γ={gamma}" if gamma else str(label)
    return f"{name} (synthetic acceptance {synthetic})" if synthetic else name


def large_batch(study: Study) -> pd.DataFrame:
    """Speedup per batch size (measured) beside the cost model's, for methods run at several batch sizes.

    The prediction uses the study's measured α̂, c and verification cost at that batch size; only a
    row without measured step costs falls back to the roofline of the study's profile (said per row).
    """
    rows = []
    for case in batch_cases(study):
        for b, p in case.pooled.items():
            pred, costs = _batch_prediction(study, case, b)
            rows.append(
                {
                    "Method": _name(case.label, case.gamma, case.synthetic),
                    "Framework": case.framework,
                    "Sampling": sampling_text(case.sampling),
                    "Batch": b,
                    "Speedup (measured)": fmt_ci(p.paired.speedup, p.paired.speedup_ci, 2, "×", n=p.sample.n_prompts),
                    "Speedup (cost model, prediction)": fmt(pred, 2, "×"),
                    "measured/predicted": fmt(p.paired.speedup / pred if isnum(pred) and pred > 0 else NAN),
                    "costs": costs if isnum(pred) else "—",
                    "n (prompts)": p.sample.n_prompts,
                    "repeats": p.sample.n_repeats,
                }
            )
    return pd.DataFrame(rows)


def _batch_prediction(study: Study, case: BatchCase, b: int) -> tuple[float, str]:
    """The cost model's speedup at batch ``b`` and where its costs came from: the study's own step costs at
    this batch size where it measured them, the roofline of its profile otherwise."""
    p, g = case.pooled[b], case.gamma
    pred, prof, params = predicted_for(p, g), study.profile, study.model_params()
    tgt = study.meta(case.cells[b][0])["model"]
    if isnum(pred) or prof is None or tgt not in params or not isnum(p.acceptance.alpha_hat):
        return pred, "measured"
    dr = study.meta(case.cells[b][0])["drafter"]
    draft = params.get(dr) if dr else None
    c = p.cost.c if isnum(p.cost.c) else None
    pr = costmodel.predict(prof, params[tgt], draft, min(p.acceptance.alpha_hat, 1.0), _cm_dtype(study, tgt), b, g, c=c)
    return pr.speedup, f"roofline ({prof.name})"


def _clause(v: str, a: Estimate, b: Estimate) -> str:
    """``1.39× [..] vs 1.03× [..]``'s verdict ``v`` in words (the row without an interval names its n)."""
    few = a if not a.has_interval else b
    return wording.phrase(v, rows=2, n=few.n)


def _compare_clause(a: Estimate, b: Estimate, expect: Direction) -> str:
    """Two rows' verdict, decided from their intervals, in words."""
    return _clause(claims.compare(a, b, expect), a, b)


def batch_claims(study: Study) -> list[str]:
    """FAQ Q4 (1) per method row: the speedup at each larger batch against the smallest, from the intervals."""
    out = []
    for case in batch_cases(study):
        est = {b: case.speedup(b) for b in case.pooled}
        b0 = case.smallest
        clauses = [
            f"batch {b} gave {estimate_text(est[b])} vs {estimate_text(est[b0])} at batch {b0}: "
            + _clause(case.verdict(b), est[b], est[b0])
            for b in sorted(est)
            if b != b0
        ]
        out.append(
            f"{_name(case.label, case.gamma, case.synthetic)} ({case.framework}, {sampling_text(case.sampling)}): the seed expects "
            "the speedup to fall as batch × (γ + 1) grows and verification turns compute-bound; here "
            f"{'; '.join(clauses)}. At batch {case.largest}, the largest measured: {wording.versus(est[case.largest])}"
        )
    return out


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
                "α pooled": fmt_ci(p.acceptance.alpha, p.acceptance.alpha_ci, n=p.sample.n_prompts),
                "Speedup (measured)": fmt_ci(p.paired.speedup, p.paired.speedup_ci, 2, "×", n=p.sample.n_prompts),
                "cells slower / cannot tell / faster than AR (own interval) / n too small": (
                    f"{k['below']} / {k['contains']} / {k['above']} / {k[claims.N_TOO_SMALL]}"
                ),
                "n (prompts)": p.sample.n_prompts,
                "repeats": p.sample.n_repeats,
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


def short_outputs(study: Study) -> pd.DataFrame:
    """Short-output cells (≤ 10 tokens) beside the same method at the headline length."""
    mnt = headline_max_new(study)
    tab = []
    for case in short_cases(study):
        ps, pl = case.short, case.long or Pooled()
        tab.append(
            {
                "Method": _name(case.label, case.gamma, case.synthetic),
                "max_new_tokens": case.max_new_tokens,
                "Framework": case.framework,
                "Sampling": sampling_text(case.sampling),
                "Speedup short (measured)": fmt_ci(
                    ps.paired.speedup, ps.paired.speedup_ci, 2, "×", n=ps.sample.n_prompts
                ),
                "AR's TTFT share of E2E (short)": fmt(ps.cost.prefill_share),
                f"Speedup at {mnt} tokens (measured)": fmt_ci(
                    pl.paired.speedup, pl.paired.speedup_ci, 2, "×", n=pl.sample.n_prompts
                ),
                "n (prompts)": ps.sample.n_prompts,
            }
        )
    return pd.DataFrame(tab)


def short_claims(study: Study) -> list[str]:
    """FAQ Q4 (3) per method row: the short-output speedup against the same method's at the headline length."""
    mnt = headline_max_new(study)
    out = []
    for case in short_cases(study):
        es = Estimate.of(case.short)
        head = (
            f"{_name(case.label, case.gamma, case.synthetic)} ({case.framework}, {sampling_text(case.sampling)}): the seed expects "
            "less speedup with ≤ 10 output tokens (the prefill and first token are the same work either way); "
            f"here {case.max_new_tokens} tokens gave {estimate_text(es)}"
        )
        if case.long is None or case.verdict is None:
            out.append(f"{head}, and the study has no row of this method at {mnt} tokens to compare it with")
            continue
        el = Estimate.of(case.long)
        out.append(f"{head} vs {estimate_text(el)} at {mnt}: {_clause(case.verdict, es, el)}")
    return out


def _configured_pairs(study: Study) -> Iterator[tuple[dict[str, Any], str, str, str]]:
    """(model pair, target, drafter, the cost model's dtype) for every configured target + drafter whose
    parameter counts are known: what the roofline predictions below are made for."""
    params = study.model_params()
    for pair in study.config.get("models", []):
        tgt = pair.get("target")
        if tgt not in params:
            continue
        dt = _cm_dtype(study, tgt)
        for mid in (pair.get("drafters") or {}).values():
            if mid in params:
                yield pair, tgt, mid, dt


def predicted_break_even(study: Study, prof: HardwareProfile | None) -> list[str]:
    """Prediction: the roofline's break-even batch for each configured pair."""
    if prof is None:
        return []
    params, lines = study.model_params(), []
    for _, tgt, mid, dt in _configured_pairs(study):
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
    params = study.model_params()
    return [_fit_line(pair, prof, tgt, mid, params, dt) for pair, tgt, mid, dt in _configured_pairs(study)]


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
            out.append(
                f"{head}; the seed expects a draft model or heads to cost memory: {wording.memory_phrase(v, g.noise)}"
            )
        elif v == claims.CANNOT_TELL:
            out.append(f"{head}, as the seed expects of a method without a draft model (within the noise)")
        elif v == claims.OBSERVED:
            out.append(f"{head}: more than the seed expects of a method without a draft model")
        else:
            out.append(head)
    return out
