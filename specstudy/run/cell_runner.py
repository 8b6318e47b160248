"""One cell measured and committed: its prompts, its warm-up, the timed pass, its stalled requests
measured again, its records annotated and written; a failure recorded instead.

The study runner (:mod:`specstudy.run.study_runner`) walks the plan and hands each cell here, or to an
in-time group (:mod:`specstudy.run.in_time_group`) that measures a baseline beside its twins.  What one
run remembers across cells (prompts loaded, engines that failed, which configurations warmed which
engine) is a :class:`RunState`.
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
from ..config import StudyConfig
from ..config.schema import Slo
from ..data.conversations import is_conversation
from ..data.model_files import tokenizer_if_here
from ..data.traces import needs_target_tokens
from ..layout import StudyLayout
from ..records import Request, RequestRecord
from ..report.validity_text import finding_text
from .capacity_search import cut_rule
from .cell import CellResult, CellRun, annotate, run_cell, split_warmup, summarize
from .conversation_cells import run_turns
from .paired_in_time import SEQUENTIAL, batches_of, link_partners
from .plan import CellPlan
from .pool import BackendPool
from .task_checks import parsed_task

RequestLoader = Callable[[str, int, int, Any], list[Request]]


@dataclass
class RunState:
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
    #: when (``time.monotonic``) the run's cells should end: the study's ``cells_budget_s`` from its start
    deadline: float = math.inf

    def time_left(self) -> float:
        """Seconds left before the deadline (inf: no budget): what an extension or a rerun may still take."""
        return self.deadline - time.monotonic()


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
    state: RunState,
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


def cell_requests(
    cfg: StudyConfig, plan: CellPlan, loader: RequestLoader, tokenizer: Any, state: RunState
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


def _after_cut(backend: Any, state: RunState, records: list[RequestRecord]) -> str:
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


def _checks_tokenizer(state: RunState, backend: Any, target: str) -> Any:
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


def stamp_checks(records: list[RequestRecord], requests: list[Request], tokenizer: Any, plan: CellPlan) -> None:
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


def commit_cell(
    cfg: StudyConfig,
    plan: CellPlan,
    layout: StudyLayout,
    state: RunState,
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
    stamp_checks(records, requests, tokenizer or _checks_tokenizer(state, backend, plan.target), plan)
    for r in records:
        r.extra.update(wu.note(), engine_instance=_engine_instance(backend))
    if tel.samples:
        layout.write_telemetry(plan.cell_id, tel.samples)
    layout.write_part(plan.cell_id, records)
    if not plan.baseline_cell_id:
        state.baselines[plan.cell_id] = records
    return summarize(plan, records, wall, baseline, summary)


def failed_cell(plan: CellPlan, layout: StudyLayout, e: Exception) -> CellResult:
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


def backend_for(plan: CellPlan, pool: BackendPool, state: RunState) -> Any:
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


def run_one(
    cfg: StudyConfig,
    plan: CellPlan,
    layout: StudyLayout,
    pool: BackendPool,
    loader: RequestLoader,
    state: RunState,
    progress: bool,
) -> CellResult:
    start_key = plan.engine_config_key()
    try:
        backend = backend_for(plan, pool, state)
        requests, warm = cell_requests(cfg, plan, loader, getattr(backend, "tokenizer", None), state)
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
        res = commit_cell(cfg, plan, layout, state, backend, measured, wu, requests, baseline)
        res.note = "; ".join(n for n in (note, _after_cut(backend, state, measured[0])) if n)
        return res
    except KeyboardInterrupt:
        raise
    except Exception as e:
        return failed_cell(plan, layout, e)
