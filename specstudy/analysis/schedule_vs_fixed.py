"""The engines' own γ schedules against the kit's best fixed γ, per load.

vLLM (``num_speculative_tokens_per_batch_size``), SGLang (``--speculative-adaptive``), TensorRT-LLM
(``draft_len_schedule``) and HF (``num_assistant_tokens_schedule``) each pick γ themselves; the kit
measures fixed γ and recommends one per load (:mod:`.gamma_schedule`).  The question a deployment asks:
does the engine's own schedule already do as well?  Per engine, method, task, model and load (a batch
size, or a request rate), the schedule's paired speedup beside the best fixed γ measured at that load
(chosen by the same robust score), and whether their 95 % intervals over prompts separate them.
Which rows are schedules comes from each engine's declaration (``schedule_options``).  Pure.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from . import stats
from .gamma_schedule import candidates, separated
from .study_records import Study

_GROUP = ("framework", "method", "task", "model", "drafter", "sampling")


def _groups(study: Study) -> dict[tuple[Any, ...], tuple[dict[tuple[str, str], list[str]], list[str]]]:
    """Per (engine, method, task, model, drafter, sampling, batch, rate): the schedule rows' cells by
    (label, schedule) and the fixed-γ cells."""
    out: dict[tuple[Any, ...], tuple[dict[tuple[str, str], list[str]], list[str]]] = {}
    for cid in study.spec_cell_ids():
        m = study.cells[cid]
        if m["gamma"] is None or m.get("synthetic"):
            continue
        key = (*(m[k] for k in _GROUP), int(m["batch_size"]), m["request_rate"])
        schedules, fixed = out.setdefault(key, ({}, []))
        if m.get("engine_schedule"):
            schedules.setdefault((m["label"], m["engine_schedule"]), []).append(cid)
        else:
            fixed.append(cid)
    return out


#: the verdicts of a row (the report words them)
SCHEDULE_AHEAD, FIXED_AHEAD, CANNOT_SEPARATE, NO_INTERVAL, NO_FIXED = (
    "schedule_ahead",
    "fixed_ahead",
    "cannot_separate",
    "no_interval",
    "no_fixed",
)


def _verdict(sched: dict[str, Any], best: dict[str, Any] | None) -> str:
    if best is None:
        return NO_FIXED
    apart = separated(sched, best)
    if apart is None:
        return NO_INTERVAL
    if not apart:
        return CANNOT_SEPARATE
    return SCHEDULE_AHEAD if sched["speedup"] > best["speedup"] else FIXED_AHEAD


def schedule_vs_fixed(study: Study) -> pd.DataFrame:
    """One row per engine schedule row × load: its speedup and interval, the fixed γ measured at the same
    load, the best of them (robust score, as :func:`.gamma_schedule.gamma_schedule` chooses), its speedup
    and interval, the verdict, and the cells it rests on (their paired AR cells included)."""
    rows = []
    for key, (schedules, fixed) in sorted(_groups(study).items(), key=lambda kv: str(kv[0])):
        cands = candidates(study, fixed)
        scored = [c for c in cands if c["score"] == c["score"]]
        best = max(scored, key=lambda c: c["score"]) if scored else None
        for (label, option), cells in sorted(schedules.items()):
            p = stats.pooled(study, cells)
            sched = {"speedup": p.paired.speedup, "speedup_ci": p.paired.speedup_ci}
            used = [*cells, *(best["cells"] if best else [])]
            bases = {b for c in used if (b := study.cells[c]["baseline_cell_id"])}
            rows.append(
                {
                    **dict(zip(_GROUP, key)),
                    "batch_size": key[-2],
                    "request_rate": key[-1],
                    "label": label,
                    "schedule": option,
                    "schedule_speedup": p.paired.speedup,
                    "schedule_ci": p.paired.speedup_ci,
                    "n_prompts": p.sample.n_prompts,
                    "fixed_gammas": [c["gamma"] for c in cands],
                    "best_gamma": best["gamma"] if best else None,
                    "best_speedup": best["speedup"] if best else float("nan"),
                    "best_ci": best["speedup_ci"] if best else (float("nan"), float("nan")),
                    "verdict": _verdict(sched, best),
                    "rests_on": sorted({*used, *bases}),
                }
            )
    return pd.DataFrame(rows)
