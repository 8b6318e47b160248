"""Paired in time: an AR baseline and the speculative cells paired with it, measured side by side.

Where one loaded engine serves both arms (the reference engine, HF per call), or where a server
whose speculation is fixed at start may run beside itself (the study's ``servers_in_time``: one
llama.cpp server per arm), the runner does not time the baseline cell and then, minutes later, each
speculative cell: it sends every prompt (a batch of them at batch sizes above 1) to each arm in
turn, in an order that reverses from one prompt to the next (AR, S1, S2 then S2, S1, AR: ABBA for
two arms).  A drift that is linear in time
(another tenant arriving, a clock that drops) then adds as much to each arm over two prompts, so it
cancels out of every paired speedup instead of landing in it.  Each speculative record keeps its
partner (the baseline cell and prompt) and how far apart in time the two were started; a cell run on
its own (a resumed study, a server) keeps them too, so the report states per row how far apart its
arms were timed, whichever way they ran.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..backends.base import Backend
from ..frameworks import server_frameworks
from ..records import PAIRED_CELL_AFTER_CELL, PAIRED_IN_TIME, Request, RequestRecord
from ..telemetry import Telemetry, TelemetrySampler
from .cell import stamp_request, warmup_sampling
from .plan import CellPlan

IN_TIME, SEQUENTIAL = PAIRED_IN_TIME, PAIRED_CELL_AFTER_CELL


def williams_rows(arms: int) -> list[list[int]]:
    """A Williams square: ``arms`` orders in which every arm holds every place once and, with each order's
    reverse beside it, every two arms are neighbours equally often, each before the other as often (the
    crossover design that balances first-order carryover).  Row 0 is 0, 1, n-1, 2, n-2, ...; row i adds i."""
    first, lo, hi = [0], 1, arms - 1
    while lo <= hi:
        first.append(lo)
        if lo < hi:
            first.append(hi)
        lo, hi = lo + 1, hi - 1
    return [[(x + i) % arms for x in first] for i in range(arms)]


def arm_orders(chunks: int, arms: int, seed: int | None = None) -> list[list[int]]:
    """Per chunk of prompts, the arms in the order they run: chunk pair j runs a row of a Williams square
    (:func:`williams_rows`), forward then reversed; with ``seed`` the square's arms are relabelled at
    random and each cycle of ``arms`` pairs walks its rows in a shuffled order (seeded: a rerun repeats
    it), else the square's own rows in their order.

    Within each pair every arm sits as often before as after every other, by the same distance: a
    linear drift adds the same to both arms of every pair.  Over 2 × arms chunks each arm holds each place
    equally often (no arm is always the first on a new prompt) and every two arms are neighbours equally
    often: a request slowed by the one just before it (another server's threads still spinning, say)
    slows no arm more than another.  The rotated order it replaces kept each arm's neighbours fixed (in
    make study's five-server llama.cpp group the A/A control always ran next to γ 8 and AR).  A group
    shorter than a cycle (or the boundary between two chunks) is balanced only in expectation, which the
    relabelling gives, every arm's place in the square being random: walked in the square's own order,
    every 5-prompt group of three arms had its A/A control follow prompt lookup three times and its
    baseline once, the same way in every group (make study, 2026-12-07: the reference A/A read below 1 on
    9 of 10 prompts)."""
    rows = williams_rows(max(arms, 1))
    shuffle = random.Random(seed) if seed is not None else None
    if shuffle is not None:  # the arms relabelled at random: a Williams square still, every arm alike in expectation
        label = list(range(max(arms, 1)))
        shuffle.shuffle(label)
        rows = [[label[x] for x in row] for row in rows]
    cycle: list[list[int]] = []
    out = []
    for i in range(chunks):
        if i % 2 == 0:
            if not cycle:
                cycle = list(rows)
                if shuffle is not None:
                    shuffle.shuffle(cycle)
            row = cycle.pop(0)
        out.append(list(row) if i % 2 == 0 else row[::-1])
    return out


def twins(baseline: CellPlan, pending: Sequence[CellPlan], servers: Mapping[str, int] | None = None) -> list[CellPlan]:
    """The speculative cells of ``pending`` to measure in time beside ``baseline``: those paired with it
    on the same engine, offline, with the same prompts and batch size.  A server (llama.cpp, vLLM,
    SGLang, ...) fixes its speculation at start: its cells run one after another unless ``servers``
    (the study's ``servers_in_time``) lets it hold one server per arm, as many arms as that allows."""
    if not baseline.is_baseline or baseline.request_rate is not None:
        return []
    room = None
    if baseline.cell.framework in server_frameworks():
        room = (servers or {}).get(baseline.cell.framework, 1) - 1
        if room < 1:
            return []
    same = (baseline.backend_key(), baseline.prompt_offset, baseline.prompts, baseline.cell.batch_size)
    return [
        p
        for p in pending
        if p.baseline_cell_id == baseline.cell_id
        and p.request_rate is None
        and (p.backend_key(), p.prompt_offset, p.prompts, p.cell.batch_size) == same
    ][:room]


def link_partners(baseline: Sequence[RequestRecord], spec: Sequence[RequestRecord], pairing: str) -> None:
    """On each speculative record: its AR partner (cell, prompt), the seconds between their starts
    (speculative minus AR) and how the pair was timed."""
    base = {(r.prompt_id, r.repeat, r.turn): r for r in baseline}
    for r in spec:
        b = base.get((r.prompt_id, r.repeat, r.turn))
        gap = r.start_epoch - b.start_epoch if b is not None and b.start_epoch and r.start_epoch else None
        r.extra.update(
            partner_cell_id=b.cell_id if b is not None else None,
            partner_prompt_id=b.prompt_id if b is not None else None,
            partner_gap_s=gap,
            pairing=pairing,
        )


def _chunks(requests: Sequence[Request], size: int) -> list[list[Request]]:
    return [list(requests[i : i + size]) for i in range(0, len(requests), max(size, 1))]


def batches_of(requests: Sequence[Request], prompt_ids: set[str], size: int) -> set[str]:
    """The prompts of every batch (of ``size``, in order) that holds one of ``prompt_ids``: what a rerun of
    those prompts measures again, so each is decoded at its own batch shape."""
    return {r.prompt_id for c in _chunks(requests, size) if any(q.prompt_id in prompt_ids for q in c) for r in c}


def measure_in_time(
    plans: Sequence[CellPlan],
    backends: Sequence[Backend],
    requests: Sequence[Request],
    warmups: Sequence[tuple[Sequence[Request], int]],
    telemetry_period_s: float,
    on_record: Callable[[int], Any] = lambda arm: None,
) -> tuple[list[list[RequestRecord]], Telemetry]:
    """Each arm's warm-up (untimed), then every chunk of prompts through every arm in :func:`arm_orders`
    under one telemetry window: per arm (in ``plans``' order, the baseline first) its stamped records.
    ``backends`` holds each arm's engine (one in-process engine for all, or a server per arm)."""
    for plan, backend, (warm, tokens) in zip(plans, backends, warmups):
        if warm:
            for _ in backend.run(list(warm), warmup_sampling(plan, tokens), plan.backend_cell()):
                pass
    by_id = {r.prompt_id: r for r in requests}
    chunks = _chunks(requests, plans[0].cell.batch_size)
    out: list[list[RequestRecord]] = [[] for _ in plans]
    sampler = TelemetrySampler(telemetry_period_s).start()
    try:
        seed = zlib.crc32(" ".join([p.cell_id for p in plans] + [r.prompt_id for r in requests]).encode())
        for i, order in enumerate(arm_orders(len(chunks), len(plans), seed)):
            for slot, a in enumerate(order):
                for rec in backends[a].run(chunks[i], plans[a].sampling, plans[a].backend_cell()):
                    rec = stamp_request(plans[a], rec, by_id)
                    rec.extra.update(arm_slot=slot, arms=len(plans))
                    out[a].append(rec)
                    on_record(a)
    finally:
        tel = sampler.stop()
    for a, recs in enumerate(out):
        if len(recs) != len(requests):
            raise RuntimeError(
                f"backend returned {len(recs)} records for {len(requests)} requests ({plans[a].cell_id})"
            )
    for recs in out[1:]:
        link_partners(out[0], recs, IN_TIME)
    return out, tel


def rerun_prompts(
    plans: Sequence[CellPlan],
    backends: Sequence[Backend],
    runs: list[list[RequestRecord]],
    requests: Sequence[Request],
    prompt_ids: set[str],
    telemetry_period_s: float,
) -> list[list[RequestRecord]]:
    """The arms with the prompts in ``prompt_ids`` (the batches that hold them, above batch 1) measured
    again, in time as before, each record of those prompts replaced (``attempt`` 2) and the others
    kept: a stall costs what its prompts cost, not the whole group again."""
    prompt_ids = batches_of(requests, prompt_ids, plans[0].cell.batch_size)
    again = [r for r in requests if r.prompt_id in prompt_ids]
    if not again:
        return runs
    fresh, _ = measure_in_time(plans, backends, again, [((), 0)] * len(plans), telemetry_period_s)
    place = {q.prompt_id: i for i, q in enumerate(requests)}
    out = []
    for old, new in zip(runs, fresh):
        for r in new:
            r.extra.update(attempt=2)
        kept = [r for r in old if r.prompt_id not in prompt_ids]
        out.append(sorted([*kept, *new], key=lambda r: place[r.prompt_id]))
    for recs in out[1:]:
        link_partners(out[0], recs, IN_TIME)
    return out
