"""The report's workload sections: conversations turn by turn (and, where a study has them, trace
replays beside Poisson arrivals and input-length / entropy tiers).  Numbers come from
:mod:`specstudy.analysis`; a section appears only when the study has such cells."""

from __future__ import annotations

from ..analysis import rates, turns
from ..analysis.study import Study
from .sections import Section, markdown_table


def conversations_section(study: Study) -> Section | None:
    """α, AL and speedup per turn of multi-turn tasks, with the prefix cache's hit rate per turn."""
    raw = turns.turn_frame(study)
    if raw.empty:
        return None
    sec = Section("Conversations: turn by turn")
    table = turns.turn_table(raw)
    sec.tables["conversation_turns"] = (table, raw)
    sec.markdown = "\n".join(
        [
            "Multi-turn records replayed turn by turn: turn k + 1 is sent with turns 1..k and the AR baseline's "
            "own greedy answers to them as its history, to the baseline and to every speculative cell paired "
            "with it, so each turn's pair decodes the same prompts. α, AL and speedup per turn are the same "
            "definitions and intervals as every other table (over conversations); the prefix-cache hit rate "
            "is the engine's own counter over that turn's run (llama.cpp `timings.cache_n`, vLLM "
            "`prefix_cache_hits / queries`), — with the prefix cache off or where the engine reports none.\n",
            markdown_table(table),
        ]
    )
    return sec


def workload_sections(study: Study) -> list[Section]:
    """The workload sections this study has data for, in order."""
    return [s for s in (conversations_section(study), traces_section(study)) if s is not None]


def traces_section(study: Study) -> Section | None:
    """Trace replays beside Poisson arrivals of the same requests at the same mean rate."""
    raw = rates.trace_frame(rates.rate_frame(study))
    if raw.empty:
        return None
    sec = Section("Trace replay beside Poisson arrivals")
    table = rates.rate_table(raw)
    sec.tables["trace_vs_poisson"] = (table, raw)
    sec.markdown = "\n".join(
        [
            "Each trace task's requests (their recorded input and output lengths, Mooncake hash blocks "
            "filled with real text in the target's tokens) sent at the trace's recorded times (`trace`) and, "
            "beside them, the same requests as a Poisson process at the trace's mean rate (`poisson`). "
            "Bursts in a trace queue requests that a Poisson process at the same mean rate spreads out: "
            "compare TTFT and TPOT p99. Send lag is the load generator's own delay against the schedule.\n",
            markdown_table(table),
        ]
    )
    return sec
