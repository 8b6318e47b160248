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
import os
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..analysis import validity
from ..backends.base import BackendUnavailable, ServingBackend
from ..backends.lifecycle import ServerStartError
from ..backends.server_base import ServerDied
from ..config import StudyConfig, display_path, hardware_names, load_hardware_profile
from ..config.schema import Slo
from ..config.task import seed_row
from ..data.conversations import is_conversation
from ..data.model_files import tokenizer_if_here
from ..data.tasks import load_requests
from ..data.traces import needs_target_tokens
from ..frameworks import server_frameworks
from ..layout import StudyLayout
from ..provenance import provenance
from ..records import Request, RequestRecord
from ..report.validity_text import finding_text
from .busy_rerun import rerun_if_busy
from .capacity_search import bisection_order, cut_rule, why_not_probed
from .cell import CellResult, CellRun, annotate, run_cell, split_warmup, summarize
from .conversation_cells import run_turns
from .engine_cost_probe import measure_engine_costs
from .paired_in_time import SEQUENTIAL, batches_of, link_partners, measure_in_time, rerun_prompts, twins
from .plan import CellPlan, plan_summary
from .pool import BackendFactory, BackendPool
from .precision import next_row, precision_doc, row_states, short_rows, spent_before
from .task_checks import check_tasks, parsed_task

RequestLoader = Callable[[str, int, int, Any], list[Request]]


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


@dataclass
class _RunState:
    """What one run remembers across cells."""

    prompts: dict[tuple[Any, ...], list[Request]] = field(default_factory=dict)
    baselines: dict[str, list[RequestRecord]] = field(default_factory=dict)
    failed_engines: dict[tuple[Any, ...], str] = field(default_factory=dict)
    #: the targets' tokenizers for the prompt checks of server cells (None: not on this machine)
    tokenizers: dict[str, Any] = field(default_factory=dict)
    #: engine configurations that failed to start (a server launch, vLLM's engine build), by
    #: :meth:`CellPlan.engine_config_key`: their later cells fail at once instead of starting again
    failed_starts: dict[tuple[Any, ...], str] = field(default_factory=dict)
    #: the run is a capacity search: its probes stop once their verdict is decided (:func:`cut_rule`)
    slo_cut: Slo | None = None
    #: per loaded engine (the backend object: one evicted and loaded again is cold again), the
    #: configurations it has been warmed up for (:func:`plan_warmup`'s key) and the cell that did it
    warmed: weakref.WeakKeyDictionary[Any, dict[tuple[Any, ...], str]] = field(
        default_factory=weakref.WeakKeyDictionary
    )


def warmup_tokens(cfg: StudyConfig, engine_warm: bool) -> int:
    """New tokens per warm-up request: full length on a cold engine, the shorter warm-engine length
    (when the study sets one) for another method, γ or batch size on an engine already warmed up."""
    if engine_warm and cfg.warm_engine_warmup_tokens is not None:
        return cfg.warm_engine_warmup_tokens
    return cfg.warmup_max_new_tokens


def input_regime(requests: Sequence[Request]) -> int:
    """The prompts' length regime: the bit length of the longest prompt (token ids where the
    request has them, else characters), so 300- and 400-token prompts share one warm-up and a
    4,000-token task gets its own (a new attention shape, KV allocation, prefill chunking)."""
    longest = max((len(r.prompt_ids) if r.prompt_ids else len(r.prompt) for r in requests), default=0)
    return int(longest).bit_length()


@dataclass(frozen=True)
class Warmup:
    """The cell's warm-up: its requests and new tokens, and which configuration warmed the engine
    for this cell (the cell whose warm-up ran for it, itself when it ran now)."""

    requests: list[Request]
    tokens: int
    key: tuple[Any, ...]
    warmed_by: str
    engine_warmed_itself: bool

    def note(self) -> dict[str, Any]:
        """What each record of the cell says about the warm-up that preceded it."""
        return {"warmup_key": repr(self.key), "warmed_by": self.warmed_by, "warmup_ran_for_cell": bool(self.requests)}


def plan_warmup(
    state: _RunState,
    backend: Any,
    plan: CellPlan,
    cfg: StudyConfig,
    warm: list[Request],
    measured: Sequence[Request] = (),
) -> Warmup:
    """The cell's warm-up: untimed requests before every configuration this loaded engine has not
    served yet (:meth:`CellPlan.warmup_key` plus the prompts' :func:`input_regime`), full length
    on the engine's first, the warm-end length after.  A server's own load-time decode (llama.cpp's
    ``warmup``) is greedy at one shape, so it no longer stands in for the study's warm-up."""
    done = state.warmed.setdefault(backend, {})
    key = (*plan.warmup_key(), input_regime(measured))
    tokens = warmup_tokens(cfg, engine_warm=bool(done))
    self_warm = bool(getattr(backend, "warms_itself", False))
    if key in done:
        return Warmup([], tokens, key, done[key], self_warm)
    done[key] = plan.cell_id
    return Warmup(warm, tokens, key, plan.cell_id, self_warm)


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
        state = _RunState(slo_cut=Slo.model_validate(dict(cfg.slo)) if capacity_search else None)
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
                    return _run_in_time(cfg, [plan, *group], layout, pool, loader, state)
                return rerun_if_busy(
                    cfg, plan, by_id, layout, lambda p: _run_one(cfg, p, layout, pool, loader, state, progress)
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
            results += _run_extensions(cfg, plans, full_plan, layout, left, say, one, shard)
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
) -> list[CellResult]:
    """The precision targets' extension cells (:mod:`specstudy.run.precision`), one row's next chunk
    at a time (:func:`~specstudy.run.precision.next_row`: the cheapest to reach its target first), until
    every row reached its target, its cap or its sweep's budget, at most ``left`` cells; each round
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
        row = next_row(states, spent, cost, {c for c in tried if not layout.is_done(c)})  # failed ones
        if row is None or row.pending is None or (left is not None and len(results) >= left):
            if states:
                layout.write_precision(precision_doc(states, spent, cost), shard)
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


def _requests(
    cfg: StudyConfig, plan: CellPlan, loader: RequestLoader, tokenizer: Any, state: _RunState
) -> tuple[list[Request], list[Request]]:
    n = plan.prompt_offset + plan.prompts + cfg.warmup_requests  # a task's order is fixed by its seed
    key = (plan.cell.task, n, plan.sampling.seed - plan.cell.repeat, plan.target)
    if tokenizer is None and key not in state.prompts and needs_target_tokens(parsed_task(cfg, plan.cell.task)):
        try:  # trace hash blocks and tiers are the target's tokens (a server's engine has loaded them by now)
            tokenizer = tokenizer_if_here(plan.target)
        except LookupError:
            tokenizer = None  # the trace's own prompt texts need none; hash blocks say what is missing
    if key not in state.prompts:
        state.prompts[key] = loader(plan.cell.task, n, plan.sampling.seed - plan.cell.repeat, tokenizer)
    return split_warmup(state.prompts[key][plan.prompt_offset :], plan.prompts, cfg.warmup_requests)


def _measure(
    cfg: StudyConfig,
    plan: CellPlan,
    backend: Any,
    requests: list[Request],
    warm: list[Request],
    warm_tokens: int,
    baseline: list[RequestRecord] | None,
    progress: bool,
    tokenizer: Any,
    slo_cut: Slo | None = None,
) -> tuple[list[RequestRecord], Any, float]:
    """One timed pass over the cell's requests (after its warm-up): records, telemetry, wall time."""
    probe = slo_cut is not None and plan.request_rate is not None and plan.arrivals == "poisson"
    # with ignore_eos every request decodes its own count: the longest bounds each one's TPOT from below
    longest = max((r.sampling_for(plan.sampling).max_new_tokens for r in requests), default=0)
    tokens = longest if plan.sampling.ignore_eos else None
    cut = cut_rule(slo_cut, len(requests), tokens) if probe and slo_cut is not None else None
    run = CellRun(plan, backend, requests, warm, warm_tokens, cfg.telemetry_period_s, progress, cut)
    t0 = time.perf_counter()
    if any(is_conversation(r) for r in requests):
        if plan.baseline_cell_id and baseline is None:
            raise RuntimeError(f"conversations take their history from the baseline {plan.baseline_cell_id}: not run")
        records, tel = run_turns(run, history=baseline, tokenizer=tokenizer)
    else:
        records, tel = run_cell(run)
        if len(records) != len(requests):
            raise RuntimeError(f"backend returned {len(records)} records for {len(requests)} requests")
    return records, tel, time.perf_counter() - t0


def _rerun_stalls(
    measure: Callable[[list[Request], list[Request]], tuple[list[RequestRecord], Any, float]],
    wu: Warmup,
    layout: StudyLayout,
    plan: CellPlan,
    requests: list[Request],
) -> tuple[tuple[list[RequestRecord], Any, float], str]:
    """The cell measured, and its stalled requests once more (the first attempt kept in ``stalled/``):
    at batch 1 only the stalled prompts, their new records replacing the old (a rerun costs what the
    stall cost); above, the batches that held them, so each is measured at its own batch shape.  With
    the progress line's note.  A conversation is not rerun: its turns take their history from the
    baseline's run."""
    run = measure(wu.requests, requests)
    first = validity.stalls(run[0])
    if not first or any(is_conversation(r) for r in requests):
        return run, ""
    layout.write_stalled(plan.cell_id, run[0])  # kept beside, read by no table
    again_ids = batches_of(requests, {f.values["prompt_id"] for f in first}, plan.cell.batch_size)
    redo = measure(wu.requests[:1], [r for r in requests if r.prompt_id in again_ids])
    for r in redo[0]:
        r.extra.update(attempt=2)
    place = {q.prompt_id: i for i, q in enumerate(requests)}
    records = sorted([*(r for r in run[0] if r.prompt_id not in again_ids), *redo[0]], key=lambda r: place[r.prompt_id])
    for r in records:
        r.extra.update(first_attempt_stalls=[finding_text(f) for f in first])
    again = validity.stalls(records)
    return (records, run[1], run[2] + redo[2]), f"{len(first)} stalled request(s), rerun once: " + (
        f"{len(again)} stalled again, cell flagged" if again else "clean"
    )


def _after_cut(backend: Any, state: _RunState, records: list[RequestRecord]) -> str:
    """A probe cut once broken (:func:`cut_rule`): its server idle again before the next cell, or stopped
    (:meth:`settle`), and then no longer counted as warmed up.  What happened, for the cell's line."""
    why = next((r.extra.get("cut") for r in records if r.status == "cut"), None)
    if why is None or not hasattr(backend, "settle"):
        return ""
    said, stopped = backend.settle()
    if stopped:
        state.warmed.pop(backend, None)
    return f"{why}; {said}"


def _engine_instance(backend: Any) -> str:
    """Which engine process served the cell (this run, the loaded backend, its server process):
    a prompt is only in a prefix cache that the same instance filled."""
    server = getattr(backend, "server", None)
    proc = getattr(server, "proc", None)
    return f"{os.getpid()}:{id(backend)}:{getattr(proc, 'pid', '-')}"


def _checks_tokenizer(state: _RunState, backend: Any, target: str) -> Any:
    """For a server's cells (its tokenizer lives in the server), the target's tokenizer where it is
    on this machine already, for the prompt checks only (None when it is not: those checks are skipped)."""
    if not isinstance(backend, ServingBackend):
        return None
    if target not in state.tokenizers:
        try:
            state.tokenizers[target] = tokenizer_if_here(target)
        except Exception:  # not here, or not a name a tokenizer loads from: the checks need it, the cell does not
            state.tokenizers[target] = None
    return state.tokenizers[target]


def _stamp_checks(records: list[RequestRecord], requests: list[Request], tokenizer: Any, plan: CellPlan) -> None:
    """What only the runner can see, on each record: the prompt checks (:func:`validity.prompt_checks`)
    and, with ``ignore_eos``, where the request would have stopped (its first EOS among the output ids)."""
    by_id = {r.prompt_id: r for r in requests}
    eos = getattr(tokenizer, "eos_token_id", None)
    for rec in records:
        req = by_id.get(rec.prompt_id)
        if req is not None:
            rec.extra.update(validity.prompt_checks(req, rec, tokenizer))
        if plan.sampling.ignore_eos and isinstance(eos, int) and rec.output_ids:
            rec.extra["past_eos_at"] = rec.output_ids.index(eos) + 1 if eos in rec.output_ids[:-1] else None


def _commit(
    cfg: StudyConfig,
    plan: CellPlan,
    layout: StudyLayout,
    state: _RunState,
    backend: Any,
    measured: tuple[list[RequestRecord], Any, float],
    wu: Warmup,
    requests: list[Request],
    baseline: list[RequestRecord] | None,
) -> CellResult:
    """The cell's records annotated (warm-up, telemetry, prompt checks, engine instance) and written:
    the commit point of the cell; its progress line."""
    records, tel, wall = measured
    summary = tel.summary()
    annotate(
        records,
        len(wu.requests),
        wall,
        summary,
        wu.tokens if wu.requests else 0,
        engine_warmed_itself=wu.engine_warmed_itself,
    )
    tokenizer = getattr(backend, "tokenizer", None)
    _stamp_checks(records, requests, tokenizer or _checks_tokenizer(state, backend, plan.target), plan)
    for r in records:
        r.extra.update(wu.note(), engine_instance=_engine_instance(backend))
    if tel.samples:
        layout.write_telemetry(plan.cell_id, tel.samples)
    layout.write_part(plan.cell_id, records)
    if not plan.baseline_cell_id:
        state.baselines[plan.cell_id] = records
    return summarize(plan, records, wall, baseline, summary)


def _failed(plan: CellPlan, layout: StudyLayout, e: Exception) -> CellResult:
    """The cell's failure recorded (``failed/<cell_id>.json``; a dead server's rows beside it): a rerun retries it."""
    extra: dict[str, Any]
    if isinstance(e, ServerDied):  # its rows are kept beside the failure, not as the cell's records
        msg = f"ServerDied: {e}"
        extra = {"rows": str(layout.write_failed_rows(plan.cell_id, [plan.stamp(r) for r in e.records]))}
    else:
        msg = f"{type(e).__name__}: {e}"
        extra = {"traceback": traceback.format_exc()}
    layout.record_failure(
        plan.cell_id,
        {
            "cell_id": plan.cell_id,
            "label": plan.label,
            "error": msg,
            **extra,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "cell": plan.as_dict(),
        },
    )
    first = msg.splitlines()[0] if isinstance(e, ServerDied) else msg
    return CellResult(plan.cell_id, plan.label, "failed", message=first, sweeps=plan.sweeps)


def _backend_for(plan: CellPlan, pool: BackendPool, state: _RunState) -> Any:
    """The cell's loaded engine; an engine (or configuration) that failed earlier fails it at once."""
    key = plan.backend_key()
    if key in state.failed_engines:
        raise RuntimeError(f"engine failed to load earlier: {state.failed_engines[key]}")
    try:
        backend = pool.get(plan)
    except Exception as e:
        state.failed_engines[key] = f"{type(e).__name__}: {e}"
        raise
    start_key = plan.engine_config_key()
    if start_key in state.failed_starts:
        raise RuntimeError(f"engine failed to start earlier with this configuration: {state.failed_starts[start_key]}")
    return backend


def _arm_backends(plans: list[CellPlan], pool: BackendPool, state: _RunState) -> list[Any]:
    """Each arm's engine: the one loaded in-process engine for all, or a server per arm (:meth:`BackendPool.arms`)."""
    if plans[0].cell.framework not in server_frameworks():
        return [_backend_for(plans[0], pool, state)] * len(plans)
    for p in plans:
        for key, failed in ((p.backend_key(), state.failed_engines), (p.engine_config_key(), state.failed_starts)):
            if key in failed:
                raise RuntimeError(f"engine failed earlier: {failed[key]}")
    return pool.arms(plans)


def _run_one(
    cfg: StudyConfig,
    plan: CellPlan,
    layout: StudyLayout,
    pool: BackendPool,
    loader: RequestLoader,
    state: _RunState,
    progress: bool,
) -> CellResult:
    start_key = plan.engine_config_key()
    try:
        backend = _backend_for(plan, pool, state)
        requests, warm = _requests(cfg, plan, loader, getattr(backend, "tokenizer", None), state)
        wu = plan_warmup(state, backend, plan, cfg, warm, requests)
        if not requests:
            raise RuntimeError(f"task {plan.cell.task!r} returned no prompts")
        baseline = None
        if plan.baseline_cell_id:
            baseline = state.baselines.get(plan.baseline_cell_id)
            if baseline is None and layout.is_done(plan.baseline_cell_id):
                baseline = layout.read_part(plan.baseline_cell_id)
        tokenizer = getattr(backend, "tokenizer", None)

        def measure(warm: list[Request], these: list[Request]) -> tuple[list[RequestRecord], Any, float]:
            try:
                return _measure(
                    cfg, plan, backend, these, warm, wu.tokens, baseline, progress, tokenizer, state.slo_cut
                )
            except (ServerStartError, BackendUnavailable) as e:
                state.failed_starts[start_key] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                raise

        measured, note = _rerun_stalls(measure, wu, layout, plan, requests)
        if baseline is not None:
            link_partners(baseline, measured[0], SEQUENTIAL)
        res = _commit(cfg, plan, layout, state, backend, measured, wu, requests, baseline)
        res.note = "; ".join(n for n in (note, _after_cut(backend, state, measured[0])) if n)
        return res
    except KeyboardInterrupt:
        raise
    except Exception as e:
        return _failed(plan, layout, e)


def _rerun_busy(
    cfg: StudyConfig,
    plans: list[CellPlan],
    backends: list[Any],
    requests: list[Request],
    layout: StudyLayout,
    measured: tuple[list[list[RequestRecord]], Any],
    wall_s: float,
) -> tuple[tuple[list[list[RequestRecord]], Any], str]:
    """An in-time group measured on a busy machine (:func:`validity.busy_during`) measured once more, every
    arm, when it took at most the study's ``busy_rerun_budget_s`` (the rerun costs as much again); the first
    attempt kept in ``stalled/``.  What is still busy stays flagged by the Validity checks, named."""
    runs, tel = measured
    busy = validity.busy_during(tel.summary())
    if not busy or wall_s > cfg.busy_rerun_budget_s:
        return measured, ""
    for p, recs in zip(plans, runs):
        layout.write_stalled(p.cell_id, recs)  # kept beside, read by no table
    runs, tel = measure_in_time(plans, backends, requests, [((), 0)] * len(plans), cfg.telemetry_period_s)
    for r in (r for recs in runs for r in recs):
        r.extra.update(attempt=2, first_attempt_busy=busy)
    still = validity.busy_during(tel.summary())
    return (runs, tel), f"busy machine ({'; '.join(busy)}), measured again with every arm: " + (
        "still busy, flagged; " if still else "quiet; "
    )


def _run_in_time(
    cfg: StudyConfig,
    plans: list[CellPlan],
    layout: StudyLayout,
    pool: BackendPool,
    loader: RequestLoader,
    state: _RunState,
) -> list[CellResult]:
    """A baseline and its twins (:func:`~specstudy.run.paired_in_time.twins`) measured prompt by prompt
    in time; stalled prompts measured again with all their arms.  Conversations, whose turns take
    their history from the baseline's run, and cells whose prompts differ run one after another."""
    try:
        backends = _arm_backends(plans, pool, state)
        loaded = [_requests(cfg, p, loader, getattr(b, "tokenizer", None), state) for p, b in zip(plans, backends)]
        requests = loaded[0][0]
        if not requests:
            raise RuntimeError(f"task {plans[0].cell.task!r} returned no prompts")
        if any(is_conversation(r) for r in requests) or any(
            [r.prompt_id for r in q] != [r.prompt_id for r in requests] for q, _ in loaded
        ):
            return [_run_one(cfg, p, layout, pool, loader, state, False) for p in plans]
        wus = [plan_warmup(state, b, p, cfg, warm, requests) for p, b, (_, warm) in zip(plans, backends, loaded)]
        t0 = time.perf_counter()
        runs, tel = measure_in_time(
            plans, backends, requests, [(w.requests, w.tokens) for w in wus], cfg.telemetry_period_s
        )
        (runs, tel), note = _rerun_busy(cfg, plans, backends, requests, layout, (runs, tel), time.perf_counter() - t0)
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
        return [_run_one(cfg, p, layout, pool, loader, state, False) for p in plans]
    results = []
    for p, b, recs, wu in zip(plans, backends, runs, wus):
        try:
            res = _commit(
                cfg, p, layout, state, b, (recs, tel, wall), wu, requests, runs[0] if p is not plans[0] else None
            )
            res.note = note.rstrip("; ")
        except Exception as e:
            res = _failed(p, layout, e)
        results.append(res)
    return results
