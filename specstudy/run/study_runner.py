"""Run the study matrix cell by cell: resume, engines loaded once, failures recorded, one line per cell.

A rerun skips every cell whose record part reads back, so a killed study loses at most the cell in
flight and never duplicates records; a part that does not read back is moved aside and its cell
runs again.  A cell that raises is recorded (``failed/<cell_id>.json``) and the others go on; an
engine that failed to load fails its other cells at once instead of loading again.  A server
that dies during a cell fails that cell (its rows, unfinished requests as ``error`` rows with the
server's last log lines, go to ``failed/<cell_id>.parquet``); the next cell starts a new server.  The paired AR
baseline of a speculative cell runs on the same engine with the same prompts and sampling, just
before it.  Prompts come from the study's task files; they are checked (:func:`check_tasks`) before
any engine loads, so a bad task file fails the run at once, listing every problem.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from ..config import StudyConfig, display_path, hardware_names, load_hardware_profile
from ..config.schema import Slo
from ..config.task import seed_row
from ..data.model_files import tokenizer_if_here
from ..data.tasks import load_requests
from ..layout import StudyLayout
from ..provenance import provenance
from .busy_rerun import rerun_if_busy
from .capacity_search import bisection_order, why_not_probed
from .cell import CellResult
from .cell_runner import RequestLoader, RunState, run_one
from .engine_cost_probe import measure_engine_costs
from .in_time_group import run_in_time
from .paired_in_time import twins
from .plan import CellPlan, plan_summary
from .pool import BackendFactory, BackendPool
from .precision import next_row, precision_doc, row_states, short_rows, spent_before
from .task_checks import check_tasks


def study_request_loader(cfg: StudyConfig) -> RequestLoader:
    """The default loader for one study: each task's prompts from the config the study parsed at load."""
    return lambda task, n, seed, tokenizer: list(load_requests(cfg.task(task), n, seed, tokenizer))


def task_snapshot(cfg: StudyConfig) -> dict[str, dict[str, Any]]:
    """Each task's file, category and seed-article row, as the report reads them (a user's task
    file need not be on the machine that renders the report)."""
    out = {}
    for name in sorted({t for sw in cfg.sweeps for t in sw.tasks}):
        try:
            tc = cfg.task(name)
        except (ValueError, OSError):  # a custom request loader may run tasks no file describes
            continue
        out[name] = {"file": display_path(tc.file), "category": tc.category, "seed_reference": seed_row(tc)}
    return out


def write_plan(layout: StudyLayout, cfg: StudyConfig, plans: Sequence[CellPlan]) -> None:
    """The expanded matrix, once per run: the report reads sweeps, pairing and tasks from it."""
    layout.write_plan(
        {
            "study": cfg.name,
            "hardware": cfg.hardware,
            "file": cfg.file,
            "config": cfg.as_dict(),
            "summary": plan_summary(plans, cfg.warmup_requests, cfg.warmup_max_new_tokens),
            "cells": [p.as_dict() for p in plans],
            "tasks": task_snapshot(cfg),
        }
    )


def run_study(
    cfg: StudyConfig,
    plans: Sequence[CellPlan],
    layout: StudyLayout,
    *,
    factory: BackendFactory | None = None,
    request_loader: RequestLoader | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    max_cells: int | None = None,
    full_plan: Sequence[CellPlan] | None = None,
    cuda: bool | None = None,
    tasks_checked: bool = False,
    shard: str | None = None,
    capacity_search: bool = False,
) -> list[CellResult]:
    """Run every plan not already done; return one result per plan (done / skipped / failed).

    ``full_plan`` (default ``plans``) is what ``study.json`` records when only a subset is run,
    so the report keeps the other sweeps' records.  With the default request loader the plans'
    task files are checked first (:func:`check_tasks`; a bad one raises before any engine loads
    or any output is written) unless the caller did (``tasks_checked``).  ``shard`` names the
    shard a cluster job runs: it locks only that shard and logs to ``jobs/<shard>.log``.
    ``capacity_search`` (``--refine-capacity``): a request-rate probe that cannot move its repeat's capacity (above
    a rate where its search broke the study's SLO, below one where it held, a longer rerun of a conclusive
    probe) is not run (:mod:`specstudy.run.capacity_search`).
    """
    if request_loader is None and not tasks_checked:
        for note in check_tasks(cfg, tokenizer=tokenizer_if_here, sweeps={s for p in plans for s in p.sweeps}):
            log(f"warning: {note}")
    loader = request_loader or study_request_loader(cfg)
    results: list[CellResult] = []
    layout.run_log_of(shard).parent.mkdir(parents=True, exist_ok=True)
    with layout.lock(shard), open(layout.run_log_of(shard), "a") as log_file:

        def say(msg: str) -> None:
            log(msg)
            log_file.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {msg}\n")
            log_file.flush()

        write_plan(layout, cfg, full_plan if full_plan is not None else plans)
        layout.append_provenance(provenance())
        if cfg.hardware in hardware_names():  # measured once here; the report predicts with the same figures
            layout.save_profile(load_hardware_profile(cfg.hardware, measure=True))
        for p in plans:
            bad = layout.check_part(p.cell_id)
            if bad:
                say(bad)
        pool = BackendPool(cfg, factory, log=say, cuda=cuda, log_dir=layout.servers_dir)
        state = RunState(slo_cut=Slo.model_validate(dict(cfg.slo)) if capacity_search else None)
        if cfg.cells_budget_s is not None:  # extensions and busy reruns fit what the planned cells leave
            state.deadline = time.monotonic() + cfg.cells_budget_s
        if capacity_search:  # each search bisects its grid: the middle rate first
            plans = bisection_order(plans)
        todo = [p for p in plans if not layout.is_done(p.cell_id)]
        pool.expect_arms(todo)  # the in-time arms' servers start together
        say(
            f"study {cfg.name} on {cfg.hardware}: {len(plans)} cells, {len(plans) - len(todo)} done earlier, "
            f"{len(todo)} to run"
        )
        try:
            ran_now: set[str] = set()
            by_id = {p.cell_id: p for p in [*(full_plan or ()), *plans]}

            def one(plan: CellPlan, pending: Sequence[CellPlan], room: int | None) -> list[CellResult]:
                """The cell, with the twins it is measured beside in time when it is their baseline."""
                left = [q for q in pending if q.cell_id not in ran_now and not layout.is_done(q.cell_id)]
                group = twins(plan, left, cfg.servers_in_time)
                group = group[: None if room is None else max(room - 1, 0)]
                ran_now.update([plan.cell_id, *(q.cell_id for q in group)])
                if group:
                    return run_in_time(cfg, [plan, *group], layout, pool, loader, state)
                return rerun_if_busy(
                    cfg,
                    plan,
                    by_id,
                    layout,
                    lambda p: run_one(cfg, p, layout, pool, loader, state, progress),
                    state.time_left,
                )

            ran = 0
            place = {p.cell_id: k for k, p in enumerate(plans, 1)}
            slo = Slo.model_validate(dict(cfg.slo))
            searched = full_plan if full_plan is not None else plans
            for i, plan in enumerate(plans, 1):
                if plan.cell_id in ran_now:
                    continue
                if layout.is_done(plan.cell_id):
                    results.append(CellResult(plan.cell_id, plan.label, "skipped", sweeps=plan.sweeps))
                    continue
                if capacity_search and (why := why_not_probed(slo, plan, searched, layout)) is not None:
                    results.append(CellResult(plan.cell_id, plan.label, "skipped", sweeps=plan.sweeps, message=why))
                    say(f"[{i}/{len(plans)}] {plan.cell_id}: {why}")
                    continue
                if max_cells is not None and ran >= max_cells:
                    break
                done = one(plan, plans, None if max_cells is None else max_cells - ran)
                ran += len(done)
                results += done
                for res in done:
                    say(res.line(place.get(res.cell_id, i), len(plans)))
            left = None if max_cells is None else max_cells - ran
            pool.expect_arms([])  # an extension group starts only its own arms
            results += _run_extensions(cfg, plans, full_plan, layout, left, say, one, shard, state.time_left)
            pool.close()  # the engine cost timings get the machine to themselves
            for problem in pool.unreleased:  # an engine that kept its memory starves the ones after it
                results.append(CellResult("engine_release", "engine release", "failed", message=problem))
            for problem in measure_engine_costs(cfg, plans, layout, say):
                results.append(CellResult("engine_costs", "engine costs", "failed", message=problem))
        finally:
            pool.close()
            failed = [r for r in results if r.status == "failed"]
            say(
                f"study {cfg.name}: {sum(r.status == 'done' for r in results)} cells run, "
                f"{sum(r.status == 'skipped' for r in results)} skipped, {len(failed)} failed"
            )
            for r in failed:
                say(f"  FAILED {r.cell_id}: {r.message}")
    return results


def _run_extensions(
    cfg: StudyConfig,
    plans: Sequence[CellPlan],
    full_plan: Sequence[CellPlan] | None,
    layout: StudyLayout,
    left: int | None,
    say: Callable[[str], None],
    run: Callable[[CellPlan, Sequence[CellPlan], int | None], list[CellResult]],
    shard: str | None = None,
    time_left: Callable[[], float] = lambda: math.inf,
) -> list[CellResult]:
    """The precision targets' extension cells (:mod:`specstudy.run.precision`), one row's next chunk
    at a time (:func:`~specstudy.run.precision.next_row`: the cheapest to reach its target first), until
    every row reached its target, its cap, its sweep's budget or the study's time (``time_left``: a chunk
    starts only when it should end within it), at most ``left`` cells; each round
    records the extensions on disk in the plan snapshot (the report counts their records as the
    plan's), and the end each row's stop."""
    results: list[CellResult] = []
    tried: set[str] = set()  # an extension that failed is not retried in the same run
    # extension seconds per sweep, and its last chunk's (what the next is expected to take), earlier runs' included
    spent, cost = spent_before(layout.read_precision(shard))  # a shard's rerun goes on with its own budget
    while True:
        on_disk, states = row_states(cfg, plans, layout)
        if on_disk:
            write_plan(layout, cfg, [*(full_plan if full_plan is not None else plans), *on_disk])
        now_left = time_left()
        row = next_row(states, spent, cost, {c for c in tried if not layout.is_done(c)}, now_left)  # failed ones
        if row is None or row.pending is None or (left is not None and len(results) >= left):
            if states:
                layout.write_precision(precision_doc(states, spent, cost, now_left), shard)
            return results
        base_ext, spec_ext = row.pending
        why = "the widest" if math.isinf(row.seconds_to_target) else f"about {row.seconds_to_target:.0f} s from it"
        say(
            f"precision targets: {len(short_rows(states))} rows short; {row.sweep} row {spec_ext.label} "
            f"(±{100 * row.half:.1f} % against ±{100 * row.target['rel_half_width']:g} %, {row.n} prompts, {why}) "
            f"gets the task's prompts {spec_ext.prompt_offset + 1}-{spec_ext.prompt_offset + spec_ext.prompts}"
        )
        # every short row extended from the same baseline chunk (an A/A control beside its headline row) runs
        # in the same group, in time with it, not after a baseline measured without it
        also = [s.pending[1] for s in short_rows(states) if s is not row and s.pending and s.pending[0] == base_ext]
        batch = [p for p in (*row.pending, *also) if not layout.is_done(p.cell_id)]
        start = time.monotonic()
        for k, plan in enumerate(batch, 1):
            if plan.cell_id in tried:  # measured beside its baseline already
                continue
            done = run(plan, batch, None if left is None else left - len(results))
            tried.update(r.cell_id for r in done)
            results += done
            for res in done:
                say(f"extension {res.line(k, len(batch))}")
        cost[row.sweep] = time.monotonic() - start
        spent[row.sweep] = spent.get(row.sweep, 0.0) + cost[row.sweep]
