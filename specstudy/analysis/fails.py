"""When speculation does not pay (the seed's FAQ Q4): large batch, α < 0.4, short outputs, memory.

Each function measures one case from the records where they allow it and puts the cost model's
prediction beside it, labelled as a prediction.  Tables are DataFrames; prediction statements
are plain strings for the report to print.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from .. import costmodel
from ..config.vocab import cost_dtype
from ..costmodel import HardwareProfile
from .format import fmt, fmt_ci, short_model
from .stats import NAN, Pooled, break_even_alpha, isnum, pooled, predicted_for
from .study import Study
from .tables import headline_max_new


def _cm_dtype(study: Study, target: str) -> str:
    """The cost model's weight format of a target: its quantization, else its dtype."""
    pair = study.model_pair(target)
    if pair is None:
        return "bf16"
    return cost_dtype(pair.get("dtype", "bf16"), pair.get("quantization", "none"))


def _spec_all(study: Study) -> list[str]:
    return [c for c in study.records if study.meta(c)["method"] != "ar"]


def large_batch(study: Study) -> pd.DataFrame:
    """Speedup per batch size (measured) beside the cost model's, for methods run at several batch sizes.

    The prediction uses the study's measured α̂, c and verification cost at that batch size; only a
    row without measured step costs falls back to the roofline of the study's profile (said per row).
    """
    prof, params, mnt = study.profile, study.model_params(), headline_max_new(study)
    spec_all = _spec_all(study)
    by_task: dict[tuple[str, str, int | None, str], set[int]] = {}
    for c in spec_all:
        m = study.meta(c)
        if m["max_new_tokens"] == mnt:
            by_task.setdefault((m["framework"], m["label"], m["gamma"], m["task"]), set()).add(m["batch_size"])
    groups: dict[tuple[str, str, int | None], dict[int, list[str]]] = {}
    for c in spec_all:  # only tasks measured at several batch sizes, so every batch row has the same prompts mix
        m = study.meta(c)
        if m["max_new_tokens"] != mnt or len(by_task[(m["framework"], m["label"], m["gamma"], m["task"])]) < 2:
            continue
        groups.setdefault((m["framework"], m["label"], m["gamma"]), {}).setdefault(m["batch_size"], []).append(c)
    rows = []
    for (fw, label, g), by_b in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)):
        if len(by_b) < 2:
            continue
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
                    "Method": f"{label} γ={g}",
                    "Framework": fw,
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


def per_cell_acceptance(study: Study) -> pd.DataFrame:
    """One row per speculative cell at batch 1: α, speedup, c, verification cost, α̂."""
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
                    "c": p.c,
                    "verify_ratio": p.verify_ratio,
                    "alpha_hat": p.alpha_hat,
                }
            )
    return pd.DataFrame(rows)


def low_alpha(study: Study, per_cell: pd.DataFrame) -> pd.DataFrame:
    """Cells with α < 0.4 against the rest: pooled α, speedup, share slower than AR."""
    lo, hi = per_cell[per_cell["alpha"] < 0.4], per_cell[per_cell["alpha"] >= 0.4]
    tab = []
    for name, part in (("α < 0.4", lo), ("α ≥ 0.4", hi)):
        cells = part["cell"].tolist()
        p = pooled(study, cells) if cells else Pooled()
        tab.append(
            {
                "Cells": name,
                "cells (n)": len(cells),
                "α pooled": fmt_ci(p.alpha, p.alpha_ci, n=p.n_prompts),
                "Speedup (measured)": fmt_ci(p.speedup, p.speedup_ci, 2, "×", n=p.n_prompts),
                "share of cells slower than AR": fmt((part["speedup"] < 1).mean() if len(part) else NAN),
                "n (prompts)": p.n_prompts,
                "repeats": p.n_repeats,
            }
        )
    return pd.DataFrame(tab)


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
    spec_all = _spec_all(study)
    short = [
        c
        for c in spec_all
        if (study.meta(c)["max_new_tokens"] or 99) <= 10 and (study.meta(c)["max_new_tokens"] or 99) < (mnt or 0)
    ]
    tab = []
    for label in sorted({study.meta(c)["label"] for c in short}):
        cs = [c for c in short if study.meta(c)["label"] == label]
        g = study.meta(cs[0])["gamma"]
        ps = pooled(study, cs)
        longc = [
            c
            for c in spec_all
            if study.meta(c)["label"] == label
            and study.meta(c)["gamma"] == g
            and study.meta(c)["batch_size"] == 1
            and study.meta(c)["max_new_tokens"] == mnt
            and study.meta(c)["task"] in {study.meta(x)["task"] for x in cs}
        ]
        pl = pooled(study, longc) if longc else Pooled()
        tab.append(
            {
                "Method": f"{label} γ={g}",
                "max_new_tokens": study.meta(cs[0])["max_new_tokens"],
                "Speedup short (measured)": fmt_ci(ps.speedup, ps.speedup_ci, 2, "×", n=ps.n_prompts),
                "TTFT share of E2E (short)": fmt(
                    ps.ttft_s / (ps.e2e_p50_s or NAN) if isnum(ps.e2e_p50_s) and ps.e2e_p50_s else NAN
                ),
                f"Speedup at {mnt} tokens (measured)": fmt_ci(pl.speedup, pl.speedup_ci, 2, "×", n=pl.n_prompts),
                "n (prompts)": ps.n_prompts,
            }
        )
    return pd.DataFrame(tab)


def memory_overhead(study: Study) -> tuple[pd.DataFrame, list[str]]:
    """Largest measured peak-memory overhead per method, and where the peaks came from."""
    rows = []
    for c in _spec_all(study):
        p = pooled(study, [c])
        if isnum(p.memory_overhead_bytes):
            rows.append(
                {
                    "label": study.meta(c)["label"],
                    "drafter": study.meta(c)["drafter"],
                    "overhead": p.memory_overhead_bytes,
                }
            )
    if not rows:
        return pd.DataFrame(), []
    md = pd.DataFrame(rows).groupby(["label"], as_index=False)["overhead"].max()
    md["Memory overhead (measured, GB)"] = md["overhead"].map(lambda x: fmt(x / 1e9, 3))
    src = sorted({r.memory_source for r in study.all_records() if r.memory_source})
    return md.rename(columns={"label": "Method"})[["Method", "Memory overhead (measured, GB)"]], src


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
