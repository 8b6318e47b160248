"""A baseline and its twins measured prompt by prompt in time, on one engine or a server per arm.

Each prompt goes to every arm in turn (:func:`~specstudy.run.paired_in_time.measure_in_time`), so a
drift of the machine lands on both arms of a pair alike.  A group measured on a busy machine is measured
again whole, within the study's budget; stalled prompts again with all their arms.  An arm that fails
leaves the others to run on their own, unpaired (:func:`~specstudy.run.cell_runner.run_one`).
"""

from __future__ import annotations

import math
import time
from typing import Any

from ..analysis import validity
from ..config import StudyConfig
from ..data.conversations import is_conversation
from ..frameworks import server_frameworks
from ..layout import StudyLayout
from ..records import Request, RequestRecord
from ..report.validity_text import finding_text
from .busy_rerun import out_of_time_note
from .cell import CellResult
from .cell_runner import (
    RequestLoader,
    RunState,
    backend_for,
    cell_requests,
    commit_cell,
    failed_cell,
    plan_warmup,
    run_one,
)
from .paired_in_time import measure_in_time, rerun_prompts
from .plan import CellPlan
from .pool import BackendPool


def _arm_backends(plans: list[CellPlan], pool: BackendPool, state: RunState) -> list[Any]:
    """Each arm's engine: the one loaded in-process engine for all, or a server per arm (:meth:`BackendPool.arms`)."""
    if plans[0].cell.framework not in server_frameworks():
        return [backend_for(plans[0], pool, state)] * len(plans)
    for p in plans:
        for key, failed in ((p.backend_key(), state.failed_engines), (p.engine_config_key(), state.failed_starts)):
            if key in failed:
                raise RuntimeError(f"engine failed earlier: {failed[key]}")
    return pool.arms(plans)


def _rerun_busy(
    cfg: StudyConfig,
    plans: list[CellPlan],
    backends: list[Any],
    requests: list[Request],
    layout: StudyLayout,
    measured: tuple[list[list[RequestRecord]], Any],
    wall_s: float,
    time_left_s: float = math.inf,
) -> tuple[tuple[list[list[RequestRecord]], Any], str]:
    """An in-time group measured on a busy machine (:func:`validity.busy_during`) measured once more, every
    arm, when it took at most the study's ``busy_rerun_budget_s`` and what the cells' budget has left (the
    rerun costs as much again); the first attempt kept in ``stalled/``.  What is still busy stays flagged by
    the Validity checks, named."""
    runs, tel = measured
    busy = validity.busy_during(tel.summary())
    if not busy or wall_s > cfg.busy_rerun_budget_s:
        return measured, ""
    if wall_s > time_left_s:
        return measured, out_of_time_note(busy, time_left_s) + "; "
    for p, recs in zip(plans, runs):
        layout.write_stalled(p.cell_id, recs)  # kept beside, read by no table
    runs, tel = measure_in_time(plans, backends, requests, [((), 0)] * len(plans), cfg.telemetry_period_s)
    for r in (r for recs in runs for r in recs):
        r.extra.update(attempt=2, first_attempt_busy=busy)
    still = validity.busy_during(tel.summary())
    return (runs, tel), f"busy machine ({'; '.join(busy)}), measured again with every arm: " + (
        "still busy, flagged; " if still else "quiet; "
    )


def run_in_time(
    cfg: StudyConfig,
    plans: list[CellPlan],
    layout: StudyLayout,
    pool: BackendPool,
    loader: RequestLoader,
    state: RunState,
) -> list[CellResult]:
    """A baseline and its twins (:func:`~specstudy.run.paired_in_time.twins`) measured prompt by prompt
    in time; stalled prompts measured again with all their arms.  Conversations, whose turns take
    their history from the baseline's run, and cells whose prompts differ run one after another."""
    try:
        backends = _arm_backends(plans, pool, state)
        loaded = [cell_requests(cfg, p, loader, getattr(b, "tokenizer", None), state) for p, b in zip(plans, backends)]
        requests = loaded[0][0]
        if not requests:
            raise RuntimeError(f"task {plans[0].cell.task!r} returned no prompts")
        if any(is_conversation(r) for r in requests) or any(
            [r.prompt_id for r in q] != [r.prompt_id for r in requests] for q, _ in loaded
        ):
            return [run_one(cfg, p, layout, pool, loader, state, False) for p in plans]
        wus = [plan_warmup(state, b, p, cfg, warm, requests) for p, b, (_, warm) in zip(plans, backends, loaded)]
        t0 = time.perf_counter()
        runs, tel = measure_in_time(
            plans, backends, requests, [(w.requests, w.tokens) for w in wus], cfg.telemetry_period_s
        )
        (runs, tel), note = _rerun_busy(
            cfg, plans, backends, requests, layout, (runs, tel), time.perf_counter() - t0, state.time_left()
        )
        found = [f for recs in runs for f in validity.stalls(recs)]
        stalled = {f.values["prompt_id"] for f in found}
        if stalled:
            for p, recs in zip(plans, runs):
                layout.write_stalled(p.cell_id, recs)  # kept beside, read by no table
            runs = rerun_prompts(plans, backends, runs, requests, stalled, cfg.telemetry_period_s)
            for r in (r for recs in runs for r in recs):
                r.extra.update(first_attempt_stalls=[f"{f.cell_id}: {finding_text(f)}" for f in found])
            again = {f.values["prompt_id"] for recs in runs for f in validity.stalls(recs)}
            note += f"{len(stalled)} stalled prompt(s) rerun with their partners: " + (
                f"{len(again)} stalled again, flagged" if again else "clean"
            )
        wall = time.perf_counter() - t0
    except KeyboardInterrupt:
        raise
    except Exception:  # one arm that fails must not take the others with it: each cell on its own, as unpaired
        return [run_one(cfg, p, layout, pool, loader, state, False) for p in plans]
    results = []
    for p, b, recs, wu in zip(plans, backends, runs, wus):
        try:
            res = commit_cell(
                cfg, p, layout, state, b, (recs, tel, wall), wu, requests, runs[0] if p is not plans[0] else None
            )
            res.note = note.rstrip("; ")
        except Exception as e:
            res = failed_cell(p, layout, e)
        results.append(res)
    return results
