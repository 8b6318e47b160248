"""Rows of a study split into strata (turns of conversations, input-length tiers, entropy tiers):
each stratum's α, AL and speedup from :func:`specstudy.analysis.stats.pooled` over the requests it
selects, and the one table format the report prints them in.  Nothing here writes a file."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pandas as pd

from .format import fmt_ci
from .stats import Keep, pooled
from .study import Study


def spec_groups(study: Study, cell_ids: list[str]) -> dict[tuple[Any, ...], list[str]]:
    """Speculative cells grouped into table rows: (framework, label, γ, task, prefix cache, batch)."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for cid in cell_ids:
        m = study.meta(cid)
        key = (m["framework"], m["label"], m["gamma"], m["task"], m["prefix_cache"], m["batch_size"])
        groups.setdefault(key, []).append(cid)
    return dict(sorted(groups.items(), key=lambda kv: str(kv[0])))


def stratum_row(study: Study, key: tuple[Any, ...], cids: list[str], keep: Keep, **extra: Any) -> dict[str, Any]:
    """One stratum of one row: its pooled α, AL and speedup (intervals over prompts) and ``extra``."""
    fw, label, gamma, task, cache, batch = key
    p = pooled(study, cids, keep=keep)
    flags = getattr(study, "flags", None) or {}
    return {
        "framework": fw,
        "label": label,
        "gamma": gamma,
        "task": task,
        "prefix_cache": cache,
        "batch_size": batch,
        **extra,
        "flagged": any(c in flags for c in cids),
        "n_prompts": p.n_prompts,
        "alpha": p.alpha,
        "alpha_ci": p.alpha_ci,
        "al": p.acceptance_length,
        "al_ci": p.acceptance_length_ci,
        "speedup": p.speedup,
        "speedup_ci": p.speedup_ci,
    }


def strata_table(raw: pd.DataFrame, columns: Mapping[str, Callable[[pd.DataFrame], Any]]) -> pd.DataFrame:
    """A strata frame as the report prints it: the row's method, the stratum ``columns``, α, AL, speedup."""
    if raw.empty:
        return raw
    head = {
        "Framework": raw["framework"],
        "Method": [
            (f"{lab} γ={g:g}" if g == g and g else str(lab)) + (" ⚑" if flag else "")
            for lab, g, flag in zip(raw["label"], raw["gamma"], raw.get("flagged", [""] * len(raw)))
        ],
        "Task": raw["task"],
        "Batch": raw["batch_size"],
    }
    n = raw["n_prompts"]
    tail = {
        "n (prompts)": n,
        "α": [fmt_ci(a, ci, 3, n=k) for a, ci, k in zip(raw["alpha"], raw["alpha_ci"], n)],
        "AL": [fmt_ci(a, ci, 2, n=k) for a, ci, k in zip(raw["al"], raw["al_ci"], n)],
        "Speedup": [fmt_ci(s, ci, 2, "×", n=k) for s, ci, k in zip(raw["speedup"], raw["speedup_ci"], n)],
    }
    return pd.DataFrame({**head, **{k: f(raw) for k, f in columns.items()}, **tail}).reset_index(drop=True)
