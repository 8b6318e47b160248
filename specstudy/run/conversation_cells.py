"""A cell of conversations: turn 1 of every conversation, then turn 2 with the answers to turn 1, ...

Whose answers make the history: the **AR baseline's**.  The baseline replays each conversation with
its own greedy answers (the target's own answer to turn k goes into turn k + 1); every speculative
cell paired with it is sent the same turn k + 1 prompts, built from the baseline's answers.  So at
every turn the speculative cell decodes exactly the input its baseline decoded and each turn's
speedup compares the same work.  Under greedy decoding a lossless method's answer is the baseline's
anyway; where an engine's speculative output differs from its own AR output (llama.cpp's batched
verification on near-ties did, on 4-5 of 12 prompts of the Qwen pair), generating each cell's
history from its own answers would let the pair drift apart from turn 2 on.  A conversation whose
history answer is missing (that turn failed in the baseline) stops there, in both cells alike.

Each turn is one run of the cell's ordinary path (:func:`specstudy.run.cell.run_cell`: offline
batches, or a request-rate run), so a prefix cache's hit counters are scoped to one turn.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ..data.conversations import answers_by_turn, next_turn
from ..records import Request, RequestRecord
from ..telemetry import Telemetry
from .cell import CellRun, run_cell


def run_turns(
    run: CellRun, *, history: Sequence[RequestRecord] | None, tokenizer: Any
) -> tuple[list[RequestRecord], Telemetry]:
    """Every turn of the run's conversations, turn by turn; ``history``: the paired baseline's
    records (None for a cell that makes its own: the baseline).  Records carry their turn."""
    given = answers_by_turn(history) if history is not None else None
    records: list[RequestRecord] = []
    samples: list[dict[str, Any]] = []
    tel = Telemetry(run.telemetry_period_s)
    current, t0 = list(run.requests), time.perf_counter()
    while current:
        run = replace(run, requests=current)
        offset = time.perf_counter() - t0
        recs, tel = run_cell(run)
        run = replace(run, warmup=())  # the engine is warm after the first turn
        by_id = {r.prompt_id: r for r in current}
        if sorted(r.prompt_id for r in recs) != sorted(by_id):
            raise RuntimeError(f"backend returned {len(recs)} records for {len(current)} requests of a turn")
        for rec in recs:
            rec.turn = int(getattr(by_id[rec.prompt_id], "turn", 1))
        samples += [{**s, "t_s": s["t_s"] + offset} if "t_s" in s else s for s in tel.samples]
        records += recs
        answers = given if given is not None else answers_by_turn(recs)
        following: list[Request] = []
        for rec in recs:
            req = by_id[rec.prompt_id]
            answer = answers.get((rec.prompt_id, rec.repeat, rec.turn))
            if getattr(req, "later_turns", ()) and answer is not None:
                following.append(next_turn(req, answer, tokenizer))  # type: ignore[arg-type]
        current = following
    tel.samples = samples
    return records, tel
