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
from .format import fmt, fmt_ci
from .rates import run_block
from .stats import at_turn, pooled
from .study import Study


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


def turn_frame(study: Study) -> pd.DataFrame:
    """One row per (framework, method, γ, task, prefix cache, turn) of the conversation cells."""
    groups: dict[tuple[object, ...], list[str]] = {}
    for cid in conversation_cells(study):
        m = study.meta(cid)
        key = (m["framework"], m["label"], m["gamma"], m["task"], m["prefix_cache"], m["batch_size"])
        groups.setdefault(key, []).append(cid)
    rows = []
    for (fw, label, gamma, task, cache, batch), cids in sorted(groups.items(), key=lambda kv: str(kv[0])):
        recs = [r for c in cids for r in study.records[c]]
        for turn in sorted({r.turn for r in recs}):
            p = pooled(study, cids, turn=turn)
            rate, source = turn_hit_rate(at_turn(recs, turn)) if cache else (None, "")
            rows.append(
                {
                    "framework": fw,
                    "label": label,
                    "gamma": gamma,
                    "task": task,
                    "batch_size": batch,
                    "prefix_cache": cache,
                    "turn": turn,
                    "n_prompts": p.n_prompts,
                    "alpha": p.alpha,
                    "alpha_ci": p.alpha_ci,
                    "al": p.acceptance_length,
                    "al_ci": p.acceptance_length_ci,
                    "speedup": p.speedup,
                    "speedup_ci": p.speedup_ci,
                    "hit_rate": rate,
                    "hit_source": source,
                }
            )
    return pd.DataFrame(rows)


def turn_table(raw: pd.DataFrame) -> pd.DataFrame:
    """The per-turn frame as the report prints it."""
    if raw.empty:
        return raw
    return pd.DataFrame(
        {
            "Framework": raw["framework"],
            "Method": [f"{lab} γ={g:g}" if g == g and g else str(lab) for lab, g in zip(raw["label"], raw["gamma"])],
            "Task": raw["task"],
            "Batch": raw["batch_size"],
            "Prefix cache": ["on" if c else "off" if c is not None else "—" for c in raw["prefix_cache"]],
            "Turn": raw["turn"],
            "n (prompts)": raw["n_prompts"],
            "α": [fmt_ci(a, ci, 3, n=n) for a, ci, n in zip(raw["alpha"], raw["alpha_ci"], raw["n_prompts"])],
            "AL": [fmt_ci(a, ci, 2, n=n) for a, ci, n in zip(raw["al"], raw["al_ci"], raw["n_prompts"])],
            "Speedup": [
                fmt_ci(s, ci, 2, "×", n=n) for s, ci, n in zip(raw["speedup"], raw["speedup_ci"], raw["n_prompts"])
            ],
            "Prefix-cache hit rate": [fmt(v, 3) if v is not None else "—" for v in raw["hit_rate"]],
        }
    ).reset_index(drop=True)
