"""The report's main body: what a paper attaches, readable in ten minutes.

The summary, one line on validity (details in the appendix), a GPU profile's *Against published numbers*,
the headline table, one figure per question
the seed asks (hardware, tasks, γ, batch, frameworks) and the definitions, stated once in *Methods*.
Everything else (the per-family and per-task tables, serving, deployment, workload, provenance) is the
appendix, after the body in the same file.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

from ..analysis import frames
from ..analysis.pairing import control_rows
from ..analysis.rows import headline_max_new
from ..analysis.study_records import Study
from ..intervals import MIN_PROMPTS_FOR_CI
from . import figures, tables
from .format import fmt_ci
from .section_type import Section, markdown_table
from .validity_text import flag_reasons

#: the appendix's heading, and the anchor the body's lines link to
APPENDIX_TITLE = "Appendix"


def validity_line(study: Study) -> Section:
    """One line: how many cells the kit vouches for, and where the details are."""
    n, flagged = len(study.records), study.flags
    if not flagged:
        text = f"The kit checked all {n} cells for the artifacts that fake a speedup and flagged none."
    else:
        why = flag_reasons(study)
        text = (
            f"**{len(flagged)} of {n} cells are flagged** ({'; '.join(why)}), marked ⚑ in every table and left "
            "out of the summary and every verdict."
        )
    controls = control_rows(study)
    if controls:
        text += (
            " A/A control (AR against AR through the same pairing): "
            + "; ".join(
                f"{r.framework} {fmt_ci(r.speedup, r.ci, 3, '×', n=r.n_prompts)}"
                + (" (biased: excludes 1×)" if r.excludes_one else "")
                for r in controls
            )
            + "."
        )
    return Section("Measurement validity", text + " Checks, findings and reruns: [Validity](#validity).\n")


def headline_section(study: Study, hardware: tuple[pd.DataFrame, pd.DataFrame]) -> Section:
    """The seed's hardware table, measured: the one table of the body."""
    table, raw = hardware
    return Section(
        f"Headline table — {study.hardware}",
        f"Batch 1, max_new_tokens={headline_max_new(study)}, pooled over the `hardware` sweep's tasks; α, AL, "
        "tokens/s, speedup and the brackets as defined in [Methods](#methods). The rest of the seed's metric "
        "table (latency percentiles, memory, quality) is in the appendix.\n\n"
        + (
            "A row marked ⚑ pooled a flagged cell: its numbers are those of its unflagged cells, the ones the "
            "summary reads (a row whose every cell is flagged shows them all); see [Validity](#validity).\n\n"
            if study.flags
            else ""
        )
        + markdown_table(table),
        tables={"hardware": (table, raw)},
    )


def _method_rows(study: Study) -> pd.DataFrame:
    """Every family's method-table rows (raw), the frame the γ and batch figures read."""
    parts = [tables.method_table(study, fam)[1] for fam in tables.families_in(study)]
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _question(title: str, name: str, fig: Figure | None, caption: str, absent: str) -> Section:
    sec = Section(title, (caption if fig is not None else absent) + "\n")
    if fig is not None:
        sec.figures[name] = fig
    return sec


def question_sections(study: Study, raw: pd.DataFrame) -> list[Section]:
    """One figure per question the seed asks, each with the sentence that says how to read it."""
    rows = _method_rows(study)
    measured = rows[pd.to_numeric(rows["speedup"], errors="coerce").notna()] if len(rows) else rows
    b1 = measured[measured["batch_size"] == 1] if len(measured) else measured
    multi = (
        measured.groupby(["label", "gamma"]).filter(lambda g: g["batch_size"].nunique() > 1)
        if len(measured)
        else measured
    )
    pts = frames.entropy_points(study, None)
    shared = raw.groupby("label").filter(lambda g: g["framework"].nunique() > 1) if len(raw) else raw
    return [
        _question(
            "Which method on this hardware?",
            "hardware_methods",
            figures.hardware_methods(raw, study.hardware) if len(raw) else None,
            "tokens/s and paired speedup per headline row, 95 % intervals; the dashed line is AR.",
            "_no headline row measured_",
        ),
        _question(
            "Which tasks accept?",
            "tasks_alpha_vs_entropy",
            figures.alpha_vs_entropy(pts, by_task=True) if len(pts) else None,
            "α of each request against the target's entropy along its output, by task (the correlation: appendix).",
            "_no request with a measured entropy_",
        ),
        _question(
            "Which γ?",
            "body_speedup_vs_gamma",
            figures.speedup_vs_gamma(b1) if len(b1) else None,
            "Paired speedup against the draft length γ at batch 1, every method; per-family tables in the appendix.",
            "_no method run at batch 1_",
        ),
        _question(
            "Which batch size?",
            "body_speedup_vs_batch",
            figures.speedup_vs_batch(multi) if len(multi) else None,
            "Paired speedup against batch size for the methods run at several batch sizes.",
            "_this study ran every method at one batch size_",
        ),
        _question(
            "Which framework?",
            "frameworks_same_method",
            figures.hardware_methods(shared, study.hardware) if len(shared) else None,
            "The methods run in more than one framework, side by side (same prompts and sampling).",
            "_no method ran in more than one framework_",
        ),
    ]


def methods_section(study: Study) -> Section:
    """Every definition the body and the appendix use, stated once."""
    return Section(
        "Methods",
        "- **α** = accepted / drafted tokens. **AL** = 1 + accepted / draft steps, pooled over tokens (the seed's "
        "expected accepted length, vLLM's mean acceptance length); *AL per request (mean)* is AIPerf's "
        "mean_acceptance_length (a request that never drafted counts 1.0; *requests never drafted* counts them). "
        "**Tokens per target forward** (prompt pass included) is a cost figure, not AL.\n"
        "- **tokens/s** = Σ output tokens / Σ E2E time; **TPOT** = (E2E − TTFT) / (output tokens − 1).\n"
        "- **Speedup** = paired AR latency / speculative latency: same prompts, sampling, engine and machine.\n"
        "- **Brackets**: 95 % intervals over distinct prompts (log-ratio t-interval for ratios, a prompt's repeats "
        f"averaged first); **n** counts distinct paired prompts; none below {MIN_PROMPTS_FOR_CI} prompts. A sentence "
        "states an effect only where its interval shows it.\n"
        "- **Predictions** are labelled: decode speedup s = tokens per step / cost per step over each row's "
        "measured draft lengths (AL(α̂, γ) / (γ·c + T(γ+1)/T(1)) when every step drafts γ; c and T(k)/T(1) "
        "in AR steps), request speedup 1 / (f (1 + d) + (1 − f) / s), f the baseline's share of E2E before "
        "the first token, d the draft model's own prompt pass. The model note names the assumption a row "
        "outside 0.9–1.1 of its prediction breaks.\n"
        "- **Entropy**: the target's mean next-token entropy (nats) along its AR output. **Best γ measured**: "
        "the highest paired speedup among the γ run; **optimal γ**: the cost model's (a prediction).\n"
        "- **Flagged** (⚑): a cell the kit cannot vouch for (a recurring stall, a busy machine, CPU steal, a "
        "clock drop); marked in every table, left out of the summary and verdicts.\n",
    )


def body_sections(
    study: Study,
    summary: Section,
    hardware: tuple[pd.DataFrame, pd.DataFrame],
    published: Section | None = None,
) -> list[Section]:
    """The main body, in order; a GPU profile's results open with its published references (``published``)."""
    table, raw = hardware
    return [
        summary,
        validity_line(study),
        *([published] if published is not None else []),
        headline_section(study, hardware),
        *question_sections(study, raw),
        methods_section(study),
    ]
