"""The report's workload sections: conversations turn by turn, trace replays beside Poisson arrivals,
input-length tiers with the random-token control, and entropy tiers.  Numbers come from
:mod:`specstudy.analysis`; a section appears only when the study has such cells."""

from __future__ import annotations

import pandas as pd

from ..analysis import claims, rates, tiers, turns
from ..analysis.study_records import Study, vouched
from ..intervals import MIN_PROMPTS_FOR_CI
from .format import fmt
from .rate_tables import rate_table
from .section_type import Section, markdown_table
from .strata_tables import entropy_tier_table, tier_table, turn_table
from .wording import estimate_text


def _one_table(title: str, name: str, table: pd.DataFrame, raw: pd.DataFrame, text: str) -> Section:
    """A section of one explained table."""
    sec = Section(title, "\n".join([text, markdown_table(table)]))
    sec.tables[name] = (table, raw)
    return sec


def conversations_section(study: Study) -> Section | None:
    """α, AL and speedup per turn of multi-turn tasks, with the prefix cache's hit rate per turn."""
    raw = turns.turn_frame(study)
    if raw.empty:
        return None
    return _one_table(
        "Conversations: turn by turn",
        "conversation_turns",
        turn_table(raw),
        raw,
        "Multi-turn records replayed turn by turn: turn k + 1 is sent with turns 1..k and the AR baseline's "
        "own greedy answers to them as its history, to the baseline and to every speculative cell paired "
        "with it, so each turn's pair decodes the same prompts. α, AL and speedup per turn are the same "
        "definitions and intervals as every other table (over conversations); the prefix-cache hit rate "
        "is the engine's own counter over that turn's run (llama.cpp `timings.cache_n`, vLLM "
        "`prefix_cache_hits / queries`), — with the prefix cache off or where the engine reports none.\n",
    )


def workload_sections(study: Study) -> list[Section]:
    """The workload sections this study has data for, in order."""
    return [s for s in (conversations_section(study), traces_section(study), tiers_section(study)) if s is not None]


def traces_section(study: Study) -> Section | None:
    """Trace replays beside Poisson arrivals of the same requests at the same mean rate."""
    raw = rates.trace_frame(rates.rate_frame(study))
    if raw.empty:
        return None
    return _one_table(
        "Trace replay beside Poisson arrivals",
        "trace_vs_poisson",
        rate_table(raw),
        raw,
        "Each trace task's requests (their recorded input and output lengths, Mooncake hash blocks "
        "filled with real text in the target's tokens) sent at the trace's recorded times (`trace`) and, "
        "beside them, the same requests as a Poisson process at the trace's mean rate (`poisson`). "
        "Bursts in a trace queue requests that a Poisson process at the same mean rate spreads out: "
        "compare TTFT and TPOT p99. Send lag is the load generator's own delay against the schedule.\n",
    )


#: a random-vs-real verdict (:func:`specstudy.analysis.claims.compare`, expecting random above) in words
OVERSTATES = {
    claims.OBSERVED: "yes: random above real (intervals disjoint)",
    claims.REVERSED: "no, the reverse: random below real (intervals disjoint)",
    claims.CANNOT_TELL: "cannot tell (the intervals overlap)",
    claims.N_TOO_SMALL: "n too small for intervals",
}


def tiers_section(study: Study) -> Section | None:
    """Input-length tiers with the random-token control, and entropy tiers of the target's own entropy."""
    raw, (ent, ent_how) = tiers.tier_frame(study), tiers.entropy_tiers_shown(study)
    if raw.empty and ent.empty and ent_how == "per task":
        return None
    sec = Section("Input-length and entropy tiers")
    parts = []
    if not raw.empty:
        table = tier_table(raw)
        # the verdicts from unflagged cells only (the table above marks the flagged rows)
        over = tiers.random_overstatement(tiers.tier_frame(vouched(study)) if study.flags else raw)
        sec.tables["input_length_tiers"] = (table, raw)
        parts += [
            "Prompts of exactly the tier's length in the target's tokens, built from the task's own texts "
            "(`real`), and beside each a prompt of as many uniformly random tokens (`random`), each paired "
            "with its AR baseline on the same input.\n",
            markdown_table(table),
        ]
        if not over.empty:
            shown = pd.DataFrame(
                {
                    **{k: over[k] for k in ("framework", "label", "gamma", "task", "batch_size", "input_tokens")},
                    "Speedup, real": [estimate_text(e) for e in over["real_speedup"]],
                    "Speedup, random": [estimate_text(e) for e in over["random_speedup"]],
                    "random / real": [fmt(v, 2) for v in over["ratio"]],
                    "Random overstates the speedup?": [OVERSTATES[v] for v in over["speedup_verdict"]],
                    "α, real": [estimate_text(e, 3, "") for e in over["real_alpha"]],
                    "α, random": [estimate_text(e, 3, "") for e in over["random_alpha"]],
                    "Random overstates α?": [OVERSTATES[v] for v in over["alpha_verdict"]],
                }
            )
            sec.tables["random_control"] = (shown, over)
            parts += [
                "\nRandom tokens against real prompts. SPEED-Bench reports that random inputs overstate "
                "speculative throughput (by about 23 %); each verdict is decided from the two rows' intervals "
                "over prompts, so a ratio above 1 is an overstatement only where the verdict says it is observed:\n",
                markdown_table(shown),
            ]
    if not ent.empty:
        table = entropy_tier_table(ent)
        sec.tables["entropy_tiers"] = (table, ent)
        parts += [
            "\nEntropy tiers: each task's prompts in thirds by the target's own mean per-token entropy over "
            "its AR baseline's output (measured while decoding; engines that report it), low to high"
            + (
                ""
                if ent_how == "per task"
                else f"; pooled over each method's tasks: every per-task tier held fewer than {MIN_PROMPTS_FOR_CI} prompts"
            )
            + ".\n",
            markdown_table(table),
        ]
    elif ent_how == "left out":
        parts.append(
            f"\nEntropy tiers left out: every tier, per task and pooled over tasks, holds fewer than "
            f"{MIN_PROMPTS_FOR_CI} prompts (n too small for an interval).\n"
        )
    sec.markdown = "\n".join(parts)
    return sec
