"""γ per load: the best draft length per batch-size (concurrency) bucket, chosen robustly.

A deployment sets γ by load (vLLM's ``tune_speculative_k`` searches it per concurrency).  Per
bucket each measured γ is scored over its repeats by the median − 1.4826 × MAD of its paired
speedup (1.4826 × MAD estimates σ for normal noise; vLLM's tuner uses the same conservative
score), γ "off" (AR) scoring 1.  Beside the choice: the cost model's best γ for the bucket from
the rows' own measured α̂, c and verification cost, and whether the 95 % intervals over prompts
(the kit's one interval) separate the chosen γ from the runner-up at all.  Pure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..metrics import paired_speedup
from . import stats
from .study_records import Study

MAD_TO_SIGMA = 1.4826
_GROUP = ("framework", "label", "task", "model", "drafter", "sampling")


def robust_score(values: Sequence[float]) -> float:
    """median − 1.4826 × MAD over repeats: a score a lucky repeat cannot lift (NaN without values)."""
    v = np.asarray([x for x in values if x == x], dtype=float)
    if not v.size:
        return math.nan
    med = float(np.median(v))
    return med - MAD_TO_SIGMA * float(np.median(np.abs(v - med)))


def _repeat_speedups(study: Study, cells: Sequence[str]) -> list[float]:
    """One paired speedup per repeat cell (its own prompts against its paired AR)."""
    out = []
    for c in cells:
        base = study.baseline(c)
        if base:
            out.append(float(paired_speedup(base, study.records[c])["speedup"]))
    return out


def candidates(study: Study, cells: Sequence[str]) -> list[dict[str, Any]]:
    """Per γ of one bucket: its repeats' speedups, robust score, interval over prompts and prediction."""
    by_gamma: dict[int, list[str]] = {}
    for c in cells:
        by_gamma.setdefault(int(study.cells[c]["gamma"]), []).append(c)
    out = []
    for g, cs in sorted(by_gamma.items()):
        p = stats.pooled(study, cs)
        reps = _repeat_speedups(study, cs)
        out.append(
            {
                "gamma": g,
                "repeats": len(reps),
                "score": robust_score(reps),
                "speedup": p.paired.speedup,
                "speedup_ci": p.paired.speedup_ci,
                "n_prompts": p.sample.n_prompts,
                "predicted": stats.predicted_for(p, g),
                "cells": sorted(cs),
            }
        )
    return out


def separated(a: dict[str, Any], b: dict[str, Any] | None) -> bool | None:
    """Whether two settings' 95 % intervals over prompts are disjoint (None: no interval; AR's is [1, 1])."""
    ci_a = a["speedup_ci"]
    ci_b = (1.0, 1.0) if b is None else b["speedup_ci"]
    if not all(x == x for x in (*ci_a, *ci_b)):
        return None
    return bool(ci_a[0] > ci_b[1] or ci_b[0] > ci_a[1])


def _choose(cands: list[dict[str, Any]]) -> dict[str, Any]:
    """The bucket's choice (off when no γ scores above AR's 1), the runner-up (AR counts as "off"),
    whether intervals separate the two, and the cost model's best γ among the measured ones."""
    scored = sorted((c for c in cands if c["score"] == c["score"]), key=lambda c: -c["score"])
    best = scored[0] if scored and scored[0]["score"] > 1.0 else None
    if best is None:
        runner_up, apart = (scored[0]["gamma"], separated(scored[0], None)) if scored else ("—", None)
    else:
        runner = next((c for c in scored[1:] if c["score"] > 1.0), None)
        runner_up, apart = (runner["gamma"] if runner else "off"), separated(best, runner)
    predictable = [c for c in cands if c["predicted"] == c["predicted"]]
    pred = max(predictable, key=lambda c: c["predicted"]) if predictable else None
    return {
        "chosen": "off" if best is None else best["gamma"],
        "score": 1.0 if best is None else best["score"],
        "runner_up": runner_up,
        "separated": apart,
        "predicted_gamma": "off" if pred is None or pred["predicted"] <= 1.0 else pred["gamma"],
        "predicted_speedup": pred["predicted"] if pred else math.nan,
        "rests_on": [cell for c in cands for cell in c["cells"]],
    }


def gamma_schedule(study: Study) -> pd.DataFrame:
    """One row per (engine, method, task, model, drafter, sampling) × batch-size bucket that measured
    at least two γ: the robust choice (or off), the runner-up, whether intervals separate them, and
    the cost model's choice; ``rests_on`` lists the cells, their paired AR cells included."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for cid in study.spec_cell_ids():
        m = study.cells[cid]
        if m["gamma"] is None or m.get("synthetic") or m.get("request_rate") is not None:
            continue
        groups.setdefault((*(m[k] for k in _GROUP), int(m["batch_size"])), []).append(cid)
    rows = []
    for key, cells in sorted(groups.items(), key=lambda kv: str(kv[0])):
        cands = candidates(study, cells)
        if len({c["gamma"] for c in cands}) < 2:
            continue  # one γ: nothing to choose between
        row = {**dict(zip((*_GROUP, "batch_size"), key)), **_choose(cands), "gammas": [c["gamma"] for c in cands]}
        bases = {b for c in cells if (b := study.cells[c]["baseline_cell_id"])}
        row["rests_on"] = sorted({*row["rests_on"], *bases})
        rows.append(row)
    return pd.DataFrame(rows)


def runs(g: pd.DataFrame) -> list[tuple[Any, int]]:
    """The schedule of one (engine, method, task): consecutive batch buckets with the same choice merged,
    as (choice, largest batch of the run), in batch order."""
    out: list[tuple[Any, int]] = []
    g = g.sort_values("batch_size")
    for chosen, b in zip(g["chosen"], g["batch_size"]):
        if out and out[-1][0] == chosen:
            out[-1] = (chosen, int(b))
        else:
            out.append((chosen, int(b)))
    return out


#: the columns that name one schedule (a row of :func:`gamma_schedule` minus its batch bucket)
SCHEDULE_KEY = _GROUP
