"""Tidy frames of a study for exploring: one row per request, per verification step, per cell.

A notebook reader groups and pivots these (``requests.groupby(["label", "gamma"])...``); every
number in them comes from :mod:`specstudy.metrics` applied to one record, so a groupby mean of
per-request values is a mean of per-request metrics, while the report's pooled figures are
ratios of sums (:mod:`specstudy.analysis.stats`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from .. import metrics
from ..records import RequestRecord
from .study_records import CELL_FIELDS, Study


def cells_frame(study: Study) -> pd.DataFrame:
    """One row per finished cell: what it is (framework, method, label, task, γ, batch, ...) and its n."""
    rows = [{**{k: m[k] for k in CELL_FIELDS}, "requests": len(study.records[cid])} for cid, m in study.cells.items()]
    return pd.DataFrame(rows, columns=[*CELL_FIELDS, "requests"])


def requests_frame(study: Study) -> pd.DataFrame:
    """One row per request: the cell's fields, status, sizes, latencies and acceptance counters."""
    rows = []
    for cid, recs in study.records.items():
        m = study.meta(cid)
        for r in recs:
            rows.append(
                {
                    **{k: m[k] for k in CELL_FIELDS if k != "sweeps"},
                    "prompt_id": r.prompt_id,
                    "turn": r.turn,
                    "input_policy": r.input_policy,
                    "status": r.status,
                    "input_tokens": r.input_tokens,
                    "output_tokens": r.output_tokens,
                    "ttft_s": metrics.ttft(r),
                    "tpot_s": metrics.tpot(r),
                    "e2e_s": metrics.e2e(r),
                    "tokens_per_s": r.output_tokens / r.end_s if r.end_s else float("nan"),
                    "drafted": r.drafted_tokens,
                    "accepted": r.accepted_tokens,
                    "draft_steps": r.draft_steps,
                    "target_forwards": r.target_forwards,
                    "alpha": metrics.acceptance_rate(r.accepted_tokens or 0, r.drafted_tokens)
                    if r.drafted_tokens
                    else float("nan"),
                    "entropy": metrics.mean_entropy([r]),
                    "peak_memory_bytes": r.peak_memory_bytes,
                    "synthetic_acceptance": r.synthetic_acceptance,
                    "load_1m": r.extra.get("load_1m"),
                }
            )
    return pd.DataFrame(rows)


def steps_frame(study: Study) -> pd.DataFrame:
    """One row per verification step of engines that expose steps: drafted, accepted, emitted, timings."""
    rows = []
    for cid, recs in study.records.items():
        m = study.meta(cid)
        for r in recs:
            for i, s in enumerate(r.steps):
                rows.append(
                    {
                        "cell_id": cid,
                        "family": m["family"],
                        "label": m["label"],
                        "task": m["task"],
                        "gamma": m["gamma"],
                        "batch_size": m["batch_size"],
                        "prompt_id": r.prompt_id,
                        "step": i,
                        "drafted": s.drafted,
                        "accepted": s.accepted,
                        "emitted": s.emitted,
                        "draft_s": s.draft_s,
                        "verify_s": s.verify_s,
                    }
                )
    return pd.DataFrame(
        rows,
        columns=[
            "cell_id",
            "family",
            "label",
            "task",
            "gamma",
            "batch_size",
            "prompt_id",
            "step",
            "drafted",
            "accepted",
            "emitted",
            "draft_s",
            "verify_s",
        ],
    )


ENTROPY_COLUMNS = ["task", "label", "framework", "gamma", "alpha", "entropy", "entropy_source", "entropy_framework"]


def _ar_entropy_by_prompt(study: Study) -> dict[tuple[str, str, Any], RequestRecord]:
    """AR records that carry the target's entropy, by (task, prompt, sampling): a stand-in
    for a baseline whose engine reports none (llama.cpp returns no logits)."""
    out: dict[tuple[str, str, Any], RequestRecord] = {}
    for c in study.records:
        m = study.meta(c)
        if m["method"] != "ar":
            continue
        for r in study.records[c]:
            if r.status == "ok" and r.token_entropy:
                out.setdefault((m["task"], r.prompt_id, m.get("sampling")), r)
    return out


def entropy_points(study: Study, tasks: Sequence[str] | None = None) -> pd.DataFrame:
    """Per request: its α and the target's mean entropy along the *paired AR* output (same prompt).

    When the paired baseline has no entropy (an engine without logits), another AR record of the
    same prompt and sampling is used: ``entropy_source`` says which (``paired AR`` or ``same prompt``)
    and ``entropy_framework`` names the framework whose AR record gave the entropy.
    """
    rows, stand_in = [], _ar_entropy_by_prompt(study)
    for c in study.records:
        m = study.meta(c)
        if m["method"] == "ar" or (tasks and m["task"] not in tasks):
            continue
        base = {(r.prompt_id, r.repeat): r for r in study.baseline(c) if r.status == "ok"}
        for r in study.records[c]:
            if r.status != "ok" or not r.drafted_tokens:
                continue
            b = base.get((r.prompt_id, r.repeat))
            src, how = (b, "paired AR") if b is not None and b.token_entropy else (None, "")
            if src is None:
                src, how = stand_in.get((m["task"], r.prompt_id, m.get("sampling"))), "same prompt"
            if src is None:
                continue
            rows.append(
                {
                    "task": m["task"],
                    "label": m["label"],
                    "framework": m["framework"],
                    "gamma": m["gamma"],
                    "alpha": metrics.acceptance_rate(r.accepted_tokens or 0, r.drafted_tokens),
                    "entropy": metrics.mean_entropy([src]),
                    "entropy_source": how,
                    "entropy_framework": src.framework,
                }
            )
    return pd.DataFrame(rows, columns=ENTROPY_COLUMNS)


def al_histogram(study: Study, cells: Sequence[str]) -> dict[tuple[str, int | None], list[int]]:
    """Tokens emitted per draft step (the acceptance-length distribution) per (label, γ), batch 1."""
    out: dict[tuple[str, int | None], list[int]] = {}
    for c in cells:
        m = study.meta(c)
        if m["batch_size"] != 1:
            continue
        for r in study.records[c]:
            if r.status == "ok":
                out.setdefault((m["label"], m["gamma"]), []).extend(s.emitted for s in r.steps[1:] if s.drafted > 0)
    return out
