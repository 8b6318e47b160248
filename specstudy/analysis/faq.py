"""The seed's FAQ Q4 cases as values: which rows each case compares and the ``Pooled`` they rest on.

Why: the case's sentences (:mod:`specstudy.report.fails`) and its table must quote the same rows
and decide from the same intervals; here they are picked once, typed, with the verdict of
:mod:`.claims` beside them, and the report only words them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from .claims import Estimate, compare
from .rows import headline_max_new
from .stats import Pooled, isnum, pooled
from .study_records import Study


def _spec_all(study: Study) -> list[str]:
    return [c for c in study.records if study.meta(c)["method"] != "ar"]


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


@dataclass(frozen=True)
class BatchCase:
    """FAQ Q4 (1) for one method row: its cells and numbers at each batch size (the smallest is the reference)."""

    framework: str
    label: str
    gamma: Any
    sampling: str
    synthetic: str | None
    cells: dict[int, list[str]]
    pooled: dict[int, Pooled]

    @property
    def smallest(self) -> int:
        return min(self.pooled)

    @property
    def largest(self) -> int:
        return max(self.pooled)

    def speedup(self, batch: int) -> Estimate:
        return Estimate.of(self.pooled[batch])

    def verdict(self, batch: int) -> str:
        """The seed expects the speedup at ``batch`` below the smallest batch's: decided from the two intervals."""
        return compare(self.speedup(batch), self.speedup(self.smallest), "below")


def batch_cases(study: Study) -> list[BatchCase]:
    """:func:`batch_groups` with each batch size's cells pooled, in the same order."""
    return [
        BatchCase(
            *key, cells={b: by_b[b] for b in sorted(by_b)}, pooled={b: pooled(study, by_b[b]) for b in sorted(by_b)}
        )
        for key, by_b in batch_groups(study).items()
    ]


def per_cell_acceptance(study: Study) -> pd.DataFrame:
    """One row per speculative cell at batch 1: α, speedup (with its interval and n), c, verification cost, α̂."""
    mnt = headline_max_new(study)
    rows = []
    for c in _spec_all(study):
        m = study.meta(c)
        if m["batch_size"] != 1 or m["max_new_tokens"] != mnt:
            continue
        p = pooled(study, [c])
        if isnum(p.acceptance.alpha) and isnum(p.paired.speedup):
            rows.append(
                {
                    "cell": c,
                    "label": m["label"],
                    "task": m["task"],
                    "gamma": m["gamma"],
                    "alpha": p.acceptance.alpha,
                    "speedup": p.paired.speedup,
                    "speedup_ci": p.paired.speedup_ci,
                    "n_prompts": p.sample.n_prompts,
                    "c": p.cost.c,
                    "verify_ratio": p.cost.verify_ratio,
                    "alpha_hat": p.acceptance.alpha_hat,
                }
            )
    return pd.DataFrame(rows)


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


@dataclass(frozen=True)
class ShortCase:
    """FAQ Q4 (3) for one method row: its short-output cells against the same row at the headline length."""

    framework: str
    label: str
    gamma: Any
    sampling: str
    synthetic: str | None
    max_new_tokens: int
    short: Pooled
    long: Pooled | None  # None: the study has no row of this method at the headline length

    @property
    def verdict(self) -> str | None:
        """The seed expects less speedup with short outputs; None without a headline row to compare with."""
        if self.long is None:
            return None
        return compare(Estimate.of(self.short), Estimate.of(self.long), "below")


def short_cases(study: Study) -> list[ShortCase]:
    """:func:`short_groups` pooled, in the same order."""
    return [
        ShortCase(*key, short=pooled(study, cs), long=pooled(study, longc) if longc else None)
        for key, cs, longc in short_groups(study)
    ]
