"""Conversations turn by turn: α, AL and speedup per turn, and the prefix cache's hit rate per turn.

A later turn carries the earlier turns and the target's own answers in its prompt, so an n-gram
drafter has more to copy from and a prefix cache more to reuse; this table shows whether that
changes acceptance and speedup.  The numbers are :func:`specstudy.analysis.stats.pooled` over one
turn's requests (the one definition of α, AL, speedup and their intervals, which resample prompts:
conversations); the hit rate is the engine's own, per turn (each turn is its own run, so run-level
counters are scoped to it).  Nothing here writes a file.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from ..records import RequestRecord
from .rates import run_block
from .stats import Keep, subset
from .strata import spec_groups, stratum_row
from .study_records import Study


def conversation_cells(study: Study) -> list[str]:
    """Speculative cells whose records hold more than one turn of a conversation."""
    return [
        cid
        for cid in study.cell_ids()
        if study.meta(cid)["baseline_cell_id"] and any(r.turn > 1 for r in study.records.get(cid, []))
    ]


def turn_hit_rate(records: Sequence[RequestRecord]) -> tuple[float | None, str]:
    """Prompt tokens the engine took from its prefix cache over all prompt tokens, for one turn's
    requests: the run-level counters each cell's run of that turn carries, summed over its cells."""
    hits = queries = 0
    source = ""
    for cid in sorted({r.cell_id for r in records}):
        block = run_block([r for r in records if r.cell_id == cid], "prefix_cache_counters")
        if block.get("queries"):
            hits, queries, source = hits + int(block["hits"]), queries + int(block["queries"]), block.get("source", "")
    return (hits / queries if queries else None), source


def _at(turn: int) -> Keep:
    return lambda r: r.turn == turn


def turn_frame(study: Study) -> pd.DataFrame:
    """One row per (framework, method, γ, task, prefix cache, batch, turn) of the conversation cells."""
    rows = []
    for key, cids in spec_groups(study, conversation_cells(study)).items():
        recs = [r for c in cids for r in study.records[c]]
        for turn in sorted({r.turn for r in recs}):
            rate, source = turn_hit_rate(subset(recs, _at(turn))) if key[4] else (None, "")
            rows.append(stratum_row(study, key, cids, _at(turn), turn=turn, hit_rate=rate, hit_source=source))
    return pd.DataFrame(rows)
