"""The report's *Against published numbers* section: each reference of the profile beside what this
study measured, the verdict in words, and, for a miss, what each usual-cause check found."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ..analysis.published import NO_VERDICT, NOT_MEASURED, OUTSIDE, REHEARSAL, WITHIN, against_published
from ..analysis.study_records import Study
from ..config.files import hardware_names
from ..config.references import load_references
from ..layout import is_rehearsal
from .section_type import Section, markdown_table

TITLE = "Against published numbers"
#: what each usual-cause check looks at, in words
CHECK_WORDS = {
    "chat_template": "chat template applied",
    "doubled_bos": "a second BOS token at the prompt's start",
    "max_model_len": "max_model_len",
    "drafter_revision": "drafter revision",
    "engine_version": "engine version",
}


def verdict_words(row: Mapping[str, Any]) -> str:
    """The verdict of one row in words."""
    v = row["verdict"]
    if v == WITHIN:
        return f"within ±{row['rel_tol']:.0%}"
    if v == OUTSIDE:
        short = row.get("short_positions") or []
        pos = f"; position(s) {', '.join(map(str, short))} below the floor" if short else ""
        return f"OUTSIDE ±{row['rel_tol']:.0%} (relative error {row['rel_error']:.1%}{pos})"
    if v == REHEARSAL:
        return "REHEARSAL: no verdict (random weights)"
    if v == NO_VERDICT:
        return (
            f"speed: shown beside its source's hardware ({row['protocol'].get('hardware', 'not stated')}), no verdict"
        )
    assert v == NOT_MEASURED
    return "not measured in this study"


def check_words(check: Mapping[str, Any]) -> str:
    """One cause check in words: what was looked at, the published value, what the records hold."""
    what = CHECK_WORDS.get(check["check"], check["check"])
    state = {True: "not the cause", False: "FOUND", None: "not recorded, not checked"}[check["ok"]]
    found = check["found"]
    if check["check"] == "doubled_bos":
        found = f"{found['doubled']} of {found['prompts']} recorded prompts start with it twice"
    return f"{what}: published {check['published']!r}, records: {found}: {state}"


def _number(v: Any, fmt: str = "{:.2f}") -> str:
    return "—" if v is None else fmt.format(v)


def _table(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "published reference": r["name"],
                "row": f"{r['model']} · {r['method']}" + (f" · {r['framework']}" if r["framework"] else ""),
                "published AL": _number(r["published_al"]),
                "measured AL": _number(r["measured_al"]),
                "published per position": ", ".join(f"{p:.3f}" for p in r["published_per_position"]) or "—",
                "measured per position": ", ".join(f"{p:.3f}" for p in r["measured_per_position"] or []) or "—",
                "published speedup": _number(r["published_speedup"], "{:.2f}x"),
                "n prompts": r["n_prompts"],
                "verdict": verdict_words(r),
                "source": r["source"],
            }
            for r in rows
        ]
    )


def published_markdown(rows: Sequence[Mapping[str, Any]], rehearsal: bool) -> str:
    """The section's text: its rule, the table, then each miss's protocol differences and checks."""
    head = (
        (
            "**REHEARSAL**: random-weight stand-ins; the numbers below mean nothing and get no verdict.\n\n"
            if rehearsal
            else ""
        )
        + "Acceptance carries across hardware, so each acceptance reference is held to its tolerance "
        "(AL pooled over prompts within ±tol, each per-position rate at least (1 − tol) of the published one, "
        "as vLLM's own test holds it); speed does not, so a speed reference is shown beside its source's hardware "
        "with no verdict.\n\n"
    )
    body = markdown_table(_table(rows))
    for r in rows:
        diffs = [
            f"{d['field']}: published {d['published']!r}, measured {d['measured']!r}" for d in r["protocol_differences"]
        ]
        checks = [check_words(c) for c in r["checks"]] if r["verdict"] in (OUTSIDE, REHEARSAL) else []
        if diffs or checks:
            body += f"\n**{r['name']}**\n\n" + "".join(f"- protocol: {d}\n" for d in diffs)
            body += "".join(f"- check: {c}\n" for c in checks)
    return head + body


def published_section(study: Study) -> Section | None:
    """The section, or None when the study's hardware file carries no references."""
    name = study.hardware.removesuffix("-rehearsal")
    refs = load_references(name) if name in hardware_names() else ()
    if not refs:
        return None
    models = study.config.get("models") or []
    target_of = {m["name"]: m["target"] for m in models if isinstance(m, Mapping) and "name" in m and "target" in m}
    records = [r for recs in study.records.values() for r in recs]
    rehearsal = is_rehearsal(study.out)
    rows = against_published(refs, records, target_of, rehearsal=rehearsal)
    sec = Section(TITLE)
    sec.markdown = published_markdown(rows, rehearsal)  # the title is the Section's own (to_markdown)
    sec.tables["against_published"] = (_table(rows), pd.DataFrame([{k: v for k, v in r.items()} for r in rows]))
    return sec
