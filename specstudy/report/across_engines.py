"""One method, one drafter, several engines: does acceptance agree?

FAQ Q3 of the seed: a fair comparison of frameworks runs the same checkpoints, so the kit runs the
same target and the same drafter (its own EAGLE-3 head, prompt lookup's n-gram rule) in several
engines on the same prompts.  Their speeds differ by design; their acceptance should not, unless
the engines draft differently.  Each group here is one (method label, drafter, γ, task, sampling) at
batch 1 measured by two or more frameworks; each framework's α and AL are
:func:`specstudy.analysis.stats.pooled`'s (intervals over prompts), and the verdict compares every
pair of AL intervals (:func:`specstudy.analysis.claims.overlap`): disjoint intervals are a
difference beyond noise, overlapping ones are not resolved.  Nothing here writes a file.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import pandas as pd

from ..analysis.claims import Estimate, overlap
from ..analysis.format import fmt_ci
from ..analysis.stats import Pooled, pooled
from ..analysis.study import Study

AGREE = "agree within noise (every pair of AL intervals overlaps)"


def groups(study: Study) -> dict[tuple[Any, ...], dict[str, list[str]]]:
    """(label, drafter, γ, task, sampling) → {framework: cell ids}, for groups of ≥ 2 frameworks."""
    out: dict[tuple[Any, ...], dict[str, list[str]]] = {}
    for cid in study.spec_cell_ids():
        m = study.meta(cid)
        if m["batch_size"] != 1 or m.get("request_rate") is not None:
            continue
        key = (m["label"], m["drafter"] or "", m["gamma"], m["task"], m["sampling"])
        out.setdefault(key, {}).setdefault(m["framework"], []).append(cid)
    return {k: v for k, v in sorted(out.items(), key=lambda kv: str(kv[0])) if len(v) >= 2}


def verdict(rows: dict[str, Pooled]) -> str:
    """Which frameworks' AL intervals are disjoint (a difference beyond noise), or that all overlap."""
    est = {fw: Estimate.of(p, "acceptance_length") for fw, p in rows.items()}
    if any(not e.has_interval for e in est.values()):
        return "n too small for intervals: not compared"
    apart = [(a, b) for a, b in combinations(sorted(est), 2) if overlap(est[a], est[b]) is False]
    if not apart:
        return AGREE
    words = [f"{a} {'above' if est[a].value > est[b].value else 'below'} {b}" for a, b in apart]
    return "differ beyond noise: " + "; ".join(words) + " (AL intervals disjoint)"


def acceptance_across_engines(study: Study) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per (group, framework): α, AL, greedy exact match and the group's verdict."""
    rows, raw = [], []
    flags = getattr(study, "flags", None) or {}
    for (label, drafter, gamma, task, sampling), by_fw in groups(study).items():
        pooled_by = {fw: pooled(study, cids) for fw, cids in sorted(by_fw.items())}
        clean = {fw: [c for c in cids if c not in flags] for fw, cids in by_fw.items()}
        # the verdict from unflagged cells only; an engine whose every cell is flagged is left out of it
        kept = {fw: pooled(study, cids) for fw, cids in sorted(clean.items()) if cids}
        said = verdict(kept) if len(kept) > 1 else "not compared: flagged cells left out (see Validity)"
        for fw, p in pooled_by.items():
            rows.append(
                {
                    "Method": label + (" ⚑" if len(clean[fw]) < len(by_fw[fw]) else ""),
                    "Drafter": drafter or "—",
                    "γ": gamma,
                    "Task": task,
                    "Sampling": sampling,
                    "Framework": fw,
                    "α": fmt_ci(p.alpha, p.alpha_ci, 3, "", n=p.n_prompts),
                    "AL": fmt_ci(p.acceptance_length, p.acceptance_length_ci, n=p.n_prompts),
                    "Greedy outputs equal AR's": "—" if p.exact_match != p.exact_match else f"{p.exact_match:.0%}",
                    "n (prompts)": p.n_prompts,
                    "Across engines": said,
                }
            )
            raw.append(
                {
                    "label": label,
                    "drafter": drafter,
                    "gamma": gamma,
                    "task": task,
                    "sampling": sampling,
                    "framework": fw,
                    "alpha": p.alpha,
                    "alpha_ci": p.alpha_ci,
                    "acceptance_length": p.acceptance_length,
                    "acceptance_length_ci": p.acceptance_length_ci,
                    "n_prompts": p.n_prompts,
                    "verdict": said,
                }
            )
    return pd.DataFrame(rows), pd.DataFrame(raw)
