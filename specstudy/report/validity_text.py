"""The Validity section's words: each finding of :mod:`specstudy.analysis.validity` as a sentence, the
findings and reruns as tables, and why flagged cells are left out."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pandas as pd

from ..analysis.pairing import ControlRow, control_rows
from ..analysis.study_records import Study
from ..analysis.validity import (
    COPY_NGRAM,
    COPY_SHARE_HIGH,
    STALL_FACTOR,
    Finding,
    Reason,
    copy_by_task,
    machine_findings,
    stalls,
)
from .format import apart_text, fmt, fmt_ci, sampling_text
from .precision_stops import stop_text, target_words
from .section_type import Section


def _stall(v: Mapping[str, Any]) -> str:
    rt, rg = v["time_ratio"], v["gap_ratio"]
    what = f"{rt:.1f}x the cell's median time per forward" if rt >= rg else f"largest gap {rg:.1f}x the median"
    if v["cause"] == "unknown":
        cause = "no engine timings: engine or client cannot be told apart"
    elif v["cause"] == "engine starved":
        cause = (
            f"engine starved: llama.cpp's own forwards up to {v['worst_forward_ms']:,.0f} ms against the cell's "
            f"median {v['median_forward_ms']:.1f} ms"
        )
    else:
        ratio = v["worst_forward_ms"] / v["median_forward_ms"]
        cause = f"client or transport: llama.cpp's own forwards within {ratio:.1f}x of the cell's median"
    return f"{v['prompt_id']}: {what} ({cause})"


#: one sentence per check, from its finding's values
WORDS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "stall": _stall,
    "busy machine": lambda v: "; ".join(v["reasons"]),
    "synthetic acceptance": lambda v: (
        f"acceptance fixed ({v['rule']}): timing only, in no acceptance or quality table and no best-method line"
    ),
    "random-token prompts": lambda v: (
        f"{v['n']} prompt(s) of random-looking token ids outside the random control: acceptance on them is not a task's"
    ),
    "double BOS": lambda v: f"{v['k']} of {v['n']} prompts start with two BOS tokens (lowers acceptance ~5 %)",
    "no chat template": lambda v: f"{v['k']} of {v['n']} prompts sent as plain text to a model with a chat template",
    "ran past EOS": lambda v: (
        f"{v['k']} of {v['n']} requests decoded past their EOS (ignore_eos): {v['share']:.0%} of output tokens"
    ),
    "counters reset": lambda v: (
        f"the engine's {', '.join(v['counters'])} counters went backwards inside the cell (reset or cache flush)"
    ),
    "server not idle": lambda v: (
        "the server had " + ", ".join(f"{n:g} {k}" for k, n in sorted(v["queue"].items())) + " when the cell began"
    ),
    "prefix cache warm": lambda v: f"{v['n']} prompt(s) already in the prefix cache from an earlier cell",
}


def finding_text(f: Finding) -> str:
    """The finding as the report's sentence."""
    return WORDS[f.check](f.values)


def reasons_text(reasons: Iterable[Reason]) -> list[str]:
    """Why a cell is left out, one phrase per reason ("busy machine", "baseline busy machine")."""
    return [f"baseline {check}" if via_baseline else check for check, via_baseline in reasons]


def _machine(study: Study, cell_id: str) -> str:
    """What the machine was doing during the cell, from the telemetry stamped on its records."""
    recs = study.records.get(cell_id) or []
    e = recs[0].extra if recs and recs[0].extra else {}

    def num(key: str, digits: int = 1) -> str:
        v = e.get(key)
        return f"{v:.{digits}f}" if isinstance(v, (int, float)) and v == v else "—"

    return (
        f"load {num('tel_load_1m_mean', 2)} (max {num('tel_load_1m_max', 2)}) on {e.get('tel_cpu_cores', '—')} cores, "
        f"{num('tel_cpu_study_cores_mean', 2)} cores used by the study and {num('tel_cpu_others_cores_mean', 2)} outside it, "
        f"steal {num('tel_cpu_steal_mean_pct')} %, CPU {num('tel_cpu_freq_min_mhz', 0)}–{num('tel_cpu_freq_max_mhz', 0)} MHz"
    )


def findings_frame(study: Study) -> pd.DataFrame:
    """One row per finding: check, the row it belongs to, the cell, what was found, whether it leaves
    the cell out, and the machine during the cell."""
    cols = ["Check", "Row", "Cell", "Finding", "Verdicts", "Machine during the cell"]
    rows = []
    for f in study.findings:
        m = study.cells.get(f.cell_id)
        if m is None:
            continue
        g = f" γ={m['gamma']}" if m["gamma"] else ""
        rows.append(
            [
                f.check,
                f"{m['framework']} {m['label']}{g} b={m['batch_size']} {m['task']} ({sampling_text(m['sampling'])})",
                f.cell_id,
                finding_text(f),
                "left out" if f.flags else "noted",
                _machine(study, f.cell_id),
            ]
        )
    return pd.DataFrame(rows, columns=cols)


def reruns_frame(study: Study) -> pd.DataFrame:
    """Cells run a second time because requests stalled in the first, or because the machine was busy
    while their in-time group ran: what the first attempt had."""
    rows = []
    for cid, recs in sorted(study.records.items()):
        busy = recs[0].extra.get("first_attempt_busy") if recs and recs[0].extra else None
        if busy:
            still = machine_findings(recs)
            rows.append(
                [
                    cid,
                    "busy machine: " + "; ".join(busy),
                    "still busy: flagged" if still else "quiet: its records are the rerun's (every arm's)",
                ]
            )
        first = recs[0].extra.get("first_attempt_stalls") if recs and recs[0].extra else None
        if first:
            again = stalls(recs)
            rows.append(
                [
                    cid,
                    "; ".join(first),
                    f"{len(again)} stalled again: flagged"
                    if again
                    else "clean: its records are the rerun's"
                    if all(r.extra.get("attempt") == 2 for r in recs)
                    else "clean: the stalled prompts' records (every arm's) are the rerun's",
                ]
            )
    return pd.DataFrame(rows, columns=["Cell", "First attempt", "Rerun"])


#: what the kit cannot check from what a cell records
NOT_CHECKED = (
    "a server's idleness at a cell's start where the engine exports no running/waiting gauges (the in-process "
    "engines have no queue; llama.cpp and vLLM servers are read from their /metrics)",
    "engines whose tokenizer is not on this machine skip the random-token, BOS, chat-template and EOS checks",
)


def _intro(study: Study) -> str:
    n, flagged = len(study.records), study.flags
    own = {f.cell_id for f in study.findings if f.flags}
    return (
        "Every cell is checked for the artifacts that fake a speedup (rules and thresholds: `docs/validity.md`): "
        f"a request whose time per forward or largest inter-token gap exceeds {STALL_FACTOR:g}× its "
        "cell's median (a stall; the cell is rerun once, or where its arms were measured in time the stalled prompts "
        "with every arm, and stays flagged if it recurs); a machine busy during the "
        "cell (other processes' CPU time beyond the cores the study leaves free, CPU steal, a clock drop, another "
        "GPU process); random-token prompts outside "
        "the random control and a doubled BOS (where the engine's tokenizer is at hand); counters that went "
        "backwards; a server not idle when the cell began; prompts already in the prefix cache from an earlier "
        "cell. Every configuration an engine had not served got an untimed warm-up request first (each part "
        "records which). "
        + (
            f"**{len(flagged)} of {n} cells are flagged** ({len(own)} by their own checks, "
            f"{len(set(flagged) - own)} through their AR baseline) and marked ⚑ in every table; the summary, "
            "best-method lines and verdicts read the other cells only.\n"
            if flagged
            else f"No cell of {n} is flagged.\n"
        )
    )


def _reading(r: ControlRow) -> str:
    """What one control says: biased, unbiased within its interval, or nothing without an interval."""
    if r.excludes_one:
        return "biased: its interval excludes 1×"
    return "1× within its interval" if r.ci[0] == r.ci[0] else "no interval (n too small)"


def control_target(study: Study, r: ControlRow) -> str:
    """The control's precision target (``aa_precision``) and whether it was reached, or what stopped it,
    from the run's precision record ("fixed n" without a target)."""
    row = study.layout.read_precision().get("cells", {}).get(r.cell_id)
    if not row:
        return "fixed n"
    return target_words(r.half_width, float(row["target"]), stop_text(study, [r.cell_id]) or row["stopped"])


def control_frame(rows: list[ControlRow], targets: Mapping[str, str] | None = None) -> pd.DataFrame:
    """The A/A controls as shown: AR against AR through a speculative row's pairing, per framework; with
    ``targets`` (per control cell id, :func:`control_target`) a column of each one's precision target."""
    return pd.DataFrame(
        [
            {
                "Framework": r.framework + (" ⚑" if r.flagged else ""),
                "Task": r.task,
                "A/A speedup": fmt_ci(r.speedup, r.ci, 3, "×", n=r.n_prompts),
                "± (half-width)": fmt(100 * r.half_width, 1, " %"),
                "n (prompts)": r.n_prompts,
                "Arms timed apart (median)": apart_text(r.apart.median_s, r.apart.order),
                "Reading": _reading(r),
                **({"Precision target": targets.get(r.cell_id, "fixed n")} if targets is not None else {}),
            }
            for r in rows
        ]
    )


def control_text(rows: list[ControlRow]) -> str:
    """The A/A paragraph that opens the Validity section ('' when the study has no control)."""
    if not rows:
        return ""
    return (
        "**The measurement's own bias and precision (A/A control)**: per framework, an AR cell measured "
        "against itself through exactly the pairing, analysis and report path of a speculative row. Its "
        "speedup should read 1× within its interval; one whose interval excludes 1× says the machine drifted "
        "or an arm was not warmed up, and every speedup of that framework carries the same bias. Its "
        "half-width is the finest speedup difference this machine resolves at that n.\n"
    )


def validity_section(study: Study) -> Section:
    """What the kit vouches for: the A/A controls first, then each check, what it found, which rows; flagged
    rows are marked ⚑ in every table and left out of the summary, the best-method lines and every verdict."""
    aa = control_rows(study)
    sec = Section("Validity", control_text(aa))
    if aa:
        targets = {r.cell_id: control_target(study, r) for r in aa}
        sec.add_table("validity_aa_control", control_frame(aa, targets), None, "")
        sec.markdown += "\n"
    sec.markdown += _intro(study)
    found = findings_frame(study)
    if len(found):
        sec.add_table("validity", found, None, "\n**Findings**\n\n")
    reruns = reruns_frame(study)
    if len(reruns):
        sec.add_table("validity_reruns", reruns, None, "\n**Cells rerun after a stall or a busy machine**\n\n")
    copy = copy_by_task(study.all_records())
    if copy:
        shown = pd.DataFrame(
            {
                "Task": list(copy),
                f"Output words inside a {COPY_NGRAM}-word run copied from the prompt": [
                    f"{v:.0%}" for v in copy.values()
                ],
                "Reading": [
                    "mostly restates its prompt: a high α here is copying" if v > COPY_SHARE_HIGH else "—"
                    for v in copy.values()
                ],
            }
        )
        sec.add_table("validity_copying", shown, None, "\n**Outputs that restate their prompt**\n\n")
    sec.markdown += "\n" + "".join(f"- Not checked: {line}.\n" for line in NOT_CHECKED)
    return sec


def flag_reasons(study: Study) -> list[str]:
    """Why the study's flagged cells are flagged, each reason once, in words."""
    return sorted({w for reasons in study.flags.values() for w in reasons_text(reasons)})


def left_out_note(whole: Study | None, part: str) -> str:
    """The line opening ``part`` (read from unflagged cells only): how many were left out and why ('' if none)."""
    if whole is None or not whole.flags:
        return ""
    n = len(whole.flags)
    why = flag_reasons(whole)
    return (
        f"_{n} flagged cell{'s' if n > 1 else ''} left out of {part} "
        f"({'; '.join(why)}): see [Validity](#validity)._\n\n"
    )
