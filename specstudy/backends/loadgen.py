"""The load generator: a cell's requests offered to a server on schedule, over one asyncio client.

Why asyncio: a sender with a thread per request starts each one late by however long the GIL
and the OS scheduler keep it waiting.  Measured here against one vLLM CPU server, a thread pool
spread 8 sends "all at once" over up to 449 ms (vLLM's own asyncio client: about 2 ms); the server
then formed different batches and TTFT differed by up to 2x between the two clients.  Here one
event loop carries every request of a run (:class:`~.connections.Http`): each request's bytes are
made before the clock starts, its TCP connection is opened just ahead of its send time
(:class:`~.connections.OpenAhead`), a task is created at the request's scheduled time and writes
the request in its first step, and the record keeps both the scheduled and the actual send time
(``scheduled_send_s``, ``sent_s``: taken right before the write) so the report can show how far
the sender drifted.

``offsets`` are the arrival times (seconds from the run start; all zero for a batch), and
``concurrency`` caps the requests in flight (a closed loop of that many clients for a batch
cell).  A request waiting for a slot is due when the slot frees: its scheduled time is then the
later of the two, and the wait is kept as ``extra["queued_s"]``.  Every request has a deadline
and so does the run; requests the run deadline leaves unsent become ``timeout`` records.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import gc
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .. import metrics
from ..records import Cell, Request, RequestRecord, Sampling
from .connections import Http, OpenAhead, address

T = TypeVar("T")
#: the last stretch before a send time is waited out by yielding to the loop, not by a timer:
#: the epoll selector rounds its timeout up to whole milliseconds
SPIN_S = 0.002
#: before a burst (several requests due when the clock starts) the sender keeps its CPU busy this
#: long.  Measured here (32-request bursts, each after 1 s idle, 10 of each side by side): send
#: spread median 3.9 ms, worst 7.5, from an idle CPU; 3.9 / 5.1 after 10 ms busy; 2.4 / 4.2 after
#: 50 ms; 2.3 / 4.2 after 100 ms.  A CPU that sat idle runs the burst's first sends slower.
WARM_S = 0.05


class AsyncSender(Protocol):
    """What the load generator needs of a backend: a request made ready ahead of its send time
    (record, HTTP request, time budget), then the send itself."""

    def prepare_send(
        self,
        http: Http,
        request: Request,
        sampling: Sampling,
        cell: Cell,
        timeout_s: float | None = None,
    ) -> Any: ...

    def transmit(
        self,
        http: Http,
        prep: Any,
        cell: Cell,
        origin: float | None = None,
        budget_s: float | None = None,
    ) -> Awaitable[RequestRecord]: ...


def run_sync(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from synchronous code, also where a loop already runs
    (a notebook): then in a fresh thread with its own loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


def unsent(request: Request, sampling: Sampling, cell: Cell, why: str, status: str = "timeout") -> RequestRecord:
    """The record of a request that never went out (run deadline) or whose client failed."""
    rec = cell.new_record(request, sampling, input_policy=getattr(request, "input_policy", "") or "")
    rec.start_epoch, rec.status, rec.error = time.time(), status, why
    return rec


async def sleep_until(t: float) -> None:
    """Sleep to the perf_counter time ``t``: a timer to just before it, then yields to the loop."""
    left = t - time.perf_counter()
    if left > SPIN_S:
        await asyncio.sleep(left - SPIN_S)
    while time.perf_counter() < t:
        await asyncio.sleep(0)


def at_once(offsets: Sequence[float], concurrency: int | None) -> int:
    """How many requests are due when the clock starts (a burst when more than one)."""
    n = sum(1 for off in offsets if off <= 0)
    return n if concurrency is None else min(n, concurrency)


def warm_up(seconds: float) -> None:
    """Keep this CPU busy for ``seconds`` (blocking: only before the clock, with nothing due)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


#: how often a run with a :class:`CutRule` looks at its requests' waits
CUT_POLL_S = 0.05


@dataclass(frozen=True)
class CutRule:
    """Stop a run once ``count`` of its requests are past one of its SLO's limits whatever they do next:
    waited past ``ttft_s`` from their arrival without a first token, decoded past ``tpot_s`` per token
    (known early only when every request decodes ``tokens`` new tokens: past its first token, a request
    in flight has a TPOT of at least its decoding time so far over ``tokens`` − 1), or unfinished past
    ``e2e_s``.  :func:`specstudy.run.capacity_search.cut_rule` says why ``count``.  The requests still
    in flight or unsent become ``cut`` records."""

    count: int
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    tokens: int | None = None  # new tokens of every request (ignore_eos): TPOT is watched only then

    def __post_init__(self) -> None:
        if self.count < 1 or not self.limits():
            raise ValueError(f"{self}: needs count >= 1 and a TTFT, E2E or (with tokens > 1) TPOT limit")

    def limits(self) -> list[tuple[str, float]]:
        """The limits watched, by name (the keys of :meth:`Waits.bounds`)."""
        tpot = self.tpot_s if self.tokens and self.tokens > 1 else None
        return [(n, v) for n, v in (("TTFT", self.ttft_s), ("TPOT", tpot), ("E2E", self.e2e_s)) if v is not None]


@dataclass(frozen=True)
class Offer:
    """One run handed to the load generator: what is sent, when, and within which limits (the runner's
    rate cells, a closed-loop batch and serve-bench all build one)."""

    requests: Sequence[Request]
    sampling: Sampling
    cell: Cell
    offsets: Sequence[float]  # send time of requests[i], seconds from the run's start
    concurrency: int | None  # requests in flight at most (None: no cap)
    request_timeout_s: float
    run_timeout_s: float
    cut: CutRule | None = None  # stop once the run has broken its SLO whatever the rest do


class Waits:
    """What a run knows, at a moment, of each request's latencies as its SLO counts them: exact once
    known, a lower bound before (in flight: since its send plus its wait for a slot; unsent behind a
    full client cap: since its arrival, its slot freeing later still).  The times are perf_counter's."""

    def __init__(
        self, t_start: float, offsets: Sequence[float], preps: Sequence[Any], done: Sequence[RequestRecord | None]
    ):
        self.t_start, self.offsets, self.preps, self.done = t_start, offsets, preps, done
        self.queued: list[float | None] = [None] * len(offsets)  # set when a request's task starts
        self.due: list[float | None] = [None] * len(offsets)

    def bounds(self, i: int, now: float, cap_full: bool, tokens: int | None) -> dict[str, float]:
        """Request i's TTFT and E2E from its arrival and its TPOT (:mod:`specstudy.metrics`' own, plus its
        wait for a slot): exact once known, else a lower bound; inf for a request that failed."""
        rec, q = self.done[i], self.queued[i] or 0.0
        if rec is not None:
            if rec.status != "ok":
                return {"TTFT": math.inf, "TPOT": math.inf, "E2E": math.inf}
            tpot = metrics.tpot(rec)  # a one-token output has none: nothing to exceed
            return {"TTFT": metrics.ttft(rec) + q, "TPOT": 0.0 if tpot != tpot else tpot, "E2E": metrics.e2e(rec) + q}
        if self.queued[i] is None:  # not sent: only a request held behind a full cap is known to wait
            waited = max(now - (self.t_start + self.offsets[i]), 0.0) if cap_full else 0.0
            return {"TTFT": waited, "TPOT": 0.0, "E2E": waited}
        live = getattr(self.preps[i], "record", None)
        sent, first = getattr(live, "sent_s", None), getattr(live, "first_token_s", None)
        since = now - self.t_start - sent if sent is not None else 0.0  # since its send
        decoding = since - first if first is not None else 0.0
        return {
            "TTFT": q + (first if first is not None else since),
            "TPOT": decoding / (tokens - 1) if tokens and tokens > 1 else 0.0,
            "E2E": q + since,
        }

    def broken(self, rule: CutRule, now: float, cap_full: bool) -> str | None:
        """Which limit ``rule.count`` requests are already past (None: none yet)."""
        bounds = [self.bounds(i, now, cap_full, rule.tokens) for i in range(len(self.offsets))]
        for name, limit in rule.limits():
            if sum(b[name] > limit for b in bounds) >= rule.count:
                return f"{rule.count} requests past {name} {limit:g} s" + ("" if name == "TPOT" else " from arrival")
        return None


async def offer_async(sender: AsyncSender, run: Offer) -> tuple[list[RequestRecord], float]:
    """Send ``requests[i]`` at ``offsets[i]``; the records in request order and the run's wall time."""
    requests, sampling, cell, offsets = run.requests, run.sampling, run.cell, run.offsets
    concurrency, request_timeout_s, run_timeout_s = run.concurrency, run.request_timeout_s, run.run_timeout_s
    if len(offsets) != len(requests):
        raise ValueError(f"{len(offsets)} offsets for {len(requests)} requests")
    if request_timeout_s <= 0 or run_timeout_s <= 0:
        raise ValueError("request_timeout_s and run_timeout_s must be > 0")
    if concurrency is not None and concurrency < 1:
        raise ValueError(f"concurrency={concurrency!r}: must be >= 1 (None: no cap)")
    records: list[RequestRecord | None] = [None] * len(requests)
    # the concurrency cap as a queue of slots, each carrying the time it was last freed: a request
    # that waited is due when its slot freed, so queueing is not counted as sender lag
    gate: asyncio.Queue[float] | None = None
    if concurrency:
        gate = asyncio.Queue()
        for _ in range(concurrency):
            gate.put_nowait(-math.inf)
    http = Http()
    ahead: OpenAhead | None = None
    tasks: list[asyncio.Task[None]] = []
    try:
        # every request made ready before the clock starts (bodies, records, HTTP requests): at its
        # send time a request only goes out; its budget is what the run deadline leaves at its arrival
        preps = [
            sender.prepare_send(
                http, r, r.sampling_for(sampling), cell, min(request_timeout_s, max(run_timeout_s - off, 1e-3))
            )
            for r, off in zip(requests, offsets)
        ]
        # connections ahead for the requests whose send time is known (all of an open loop, the
        # first `concurrency` of a closed one); those due first are connected before the clock
        known = range(len(requests) if gate is None else min(len(requests), concurrency or 0))
        ahead = OpenAhead(http.connections, [address(p) for p in preps], offsets, known)
        await ahead.before_clock()
        if at_once(offsets, concurrency) > 1:
            warm_up(WARM_S)
        # what is alive now (modules, models, this run's prepared requests) is moved out of the
        # collector's reach for the run: a full collection over it paused the loop ~35 ms in about
        # 1 burst in 20 here (the first sends of a 32-request burst wrote 35 ms after their send
        # time), none in 24 with it.  Freezing also empties the youngest generation; a 32-request
        # burst still makes ~790 allocations (180 before its first write, 19 a send) against the
        # threshold of 700, so one young collection (0.17-0.24 ms, measured) lands near its end
        gc.freeze()
        t_start = time.perf_counter()
        deadline = t_start + run_timeout_s
        waits = Waits(t_start, offsets, preps, records)
        opener = ahead

        async def one(i: int, due: float, queued: float) -> None:
            waits.queued[i], waits.due[i] = queued, due
            try:
                left = deadline - time.perf_counter()  # a request that queued has less of the run left
                rec = await sender.transmit(http, preps[i], cell, origin=t_start, budget_s=max(left, 1e-3))
            except Exception as e:  # a client bug must still leave a record, not a hole
                rec = unsent(requests[i], sampling, cell, f"{type(e).__name__}: {e}"[:2000], status="error")
            finally:
                if gate is not None:
                    gate.put_nowait(time.perf_counter())
            rec.scheduled_send_s = due
            if queued > 0:
                rec.extra["queued_s"] = queued
            records[i] = rec

        async def send_all() -> None:
            for i, off in enumerate(offsets):
                arrival = t_start + off
                if arrival >= deadline:
                    records[i] = unsent(requests[i], sampling, cell, f"not sent: run time limit {run_timeout_s:.0f} s")
                    continue
                await opener.before_send(i, arrival)
                await sleep_until(arrival)
                freed = -math.inf
                if gate is not None:
                    try:
                        freed = await asyncio.wait_for(gate.get(), max(0.0, deadline - time.perf_counter()))
                    except asyncio.TimeoutError:
                        records[i] = unsent(
                            requests[i], sampling, cell, "not sent: run time limit while waiting for a slot"
                        )
                        continue
                if time.perf_counter() >= deadline:
                    if gate is not None:
                        gate.put_nowait(freed)
                    records[i] = unsent(requests[i], sampling, cell, f"not sent: run time limit {run_timeout_s:.0f} s")
                    continue
                due = max(arrival, freed)
                tasks.append(asyncio.create_task(one(i, due - t_start, due - arrival)))
                opener.after_send(time.perf_counter() - t_start, offsets[i + 1] if i + 1 < len(offsets) else math.inf)
            if tasks:
                await asyncio.wait(tasks)

        why = await _until_cut(asyncio.ensure_future(send_all()), tasks, run.cut, waits, gate)
        wall = time.perf_counter() - t_start
        if why is not None:
            _cut_records(records, waits, run, f"probe stopped at {wall:.1f} s: {why}")
    finally:
        if ahead is not None:
            await ahead.aclose()
        await http.aclose()
        gc.unfreeze()
    return [r for r in records if r is not None], wall


async def _until_cut(
    sending: asyncio.Future[None],
    tasks: list[asyncio.Task[None]],
    rule: CutRule | None,
    waits: Waits,
    gate: asyncio.Queue[float] | None,
) -> str | None:
    """The run to its end, or (with ``rule``) until it has broken its SLO: then sending stops and the
    requests in flight are cancelled (their connections close, which a server reads as an abort).
    Returns why it was cut (None: it ran to its end)."""
    while rule is not None and not sending.done():
        await asyncio.wait({sending}, timeout=CUT_POLL_S)
        why = None if sending.done() else waits.broken(rule, time.perf_counter(), gate is not None and gate.empty())
        if why is not None:
            for t in (sending, *tasks):
                t.cancel()
            await asyncio.gather(sending, *tasks, return_exceptions=True)
            return why
    await sending
    return None


def _cut_records(records: list[RequestRecord | None], waits: Waits, run: Offer, why: str) -> None:
    """Every request a cut left without a record becomes a ``cut`` one (a request in flight keeps what
    its stream had read and its send times); every record of the run says where it was cut."""
    for i, rec in enumerate(records):
        if rec is not None:
            continue
        live = getattr(waits.preps[i], "record", None)
        if waits.due[i] is not None and isinstance(live, RequestRecord):
            rec, rec.status, rec.error = live, "cut", why
            rec.scheduled_send_s = waits.due[i]
            if waits.queued[i]:
                rec.extra["queued_s"] = waits.queued[i]
        else:
            rec = unsent(run.requests[i], run.sampling, run.cell, why, status="cut")
            rec.scheduled_send_s = run.offsets[i]
        records[i] = rec
    for rec in records:
        if rec is not None:
            rec.extra["cut"] = why


def offer(sender: AsyncSender, run: Offer) -> tuple[list[RequestRecord], float]:
    """:func:`offer_async` from synchronous code (the runner, the serving driver)."""
    return run_sync(lambda: offer_async(sender, run))


def batch_deadline(n: int, batch_size: int, request_timeout_s: float) -> float:
    """A run deadline for a closed-loop batch that no healthy run can reach: every wave of
    ``batch_size`` requests may use its full per-request budget."""
    return max(1, math.ceil(n / max(1, batch_size))) * request_timeout_s + 60.0
