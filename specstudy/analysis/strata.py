"""Rows of a study split into strata (turns of conversations, input-length tiers, entropy tiers):
each stratum's α, AL and speedup from :func:`specstudy.analysis.stats.pooled` over the requests it
selects (:mod:`specstudy.report.strata_tables` words them).  Nothing here writes a file."""

from __future__ import annotations

from typing import Any

from .stats import Keep, pooled
from .study_records import Study


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
        "n_prompts": p.sample.n_prompts,
        "alpha": p.acceptance.alpha,
        "alpha_ci": p.acceptance.alpha_ci,
        "al": p.acceptance.acceptance_length,
        "al_ci": p.acceptance.acceptance_length_ci,
        "speedup": p.paired.speedup,
        "speedup_ci": p.paired.speedup_ci,
    }
