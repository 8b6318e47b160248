"""The report's opening summary: sentences computed from its own tables, each linked to the table it quotes.

Nothing here is written by hand: every figure comes from the raw frames of
:mod:`specstudy.analysis` (best method per framework and sampling, the seed's FAQ Q4 cases as this
study measured them, greedy outputs that differ from AR, the study's size and precision), and
every effect is worded from its interval (:mod:`specstudy.analysis.claims`: observed, reversed,
cannot tell, n too small), so the summary changes when the records do and never says more than they show.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from .. import metrics
from ..analysis import claims, faq, row_parts
from ..analysis.claims import Estimate
from ..analysis.pairing import control_rows
from ..analysis.rows import HardwareRow
from ..analysis.stats import isnum
from ..analysis.study_records import Study
from ..intervals import MIN_PROMPTS_FOR_CI
from . import fails, wording
from .format import fmt, sampling_text
from .wording import estimate_text


def _link(name: str) -> str:
    return f"[{name}](tables/{name}.md)"


def _row_name(r: HardwareRow) -> str:
    return f"{r.label} (γ={r.gamma})" if r.gamma else str(r.label)


def _sampling_order(samplings: Iterable[str]) -> list[str]:
    """Greedy first: the row a lossless method's speed is usually quoted at."""
    return sorted(set(samplings), key=lambda s: (s != "greedy", s))


def _speculative(rows: Sequence[HardwareRow]) -> list[HardwareRow]:
    """The rows a best method is picked from: speculative, measured acceptance, a speedup."""
    return [r for r in rows if not r.is_ar and r.pooled.sample.synthetic is None and isnum(r.pooled.paired.speedup)]


def best_per_framework(hw_rows: Sequence[HardwareRow]) -> list[str]:
    """Per framework and sampling: the fastest row at batch 1 among rows with enough prompts for an interval.

    The runner-up and whether the two intervals overlap are named, and how many rows the best was
    picked from: the largest of many noisy estimates is biased upward.
    """
    lines: list[str] = []
    spec = _speculative(hw_rows)
    for fw in sorted({r.framework for r in spec}):
        g_fw = [r for r in spec if r.framework == fw]
        for sampling in _sampling_order(r.sampling for r in g_fw):
            g = [r for r in g_fw if r.sampling == sampling]
            ok = sorted(
                (r for r in g if r.pooled.sample.n_prompts >= MIN_PROMPTS_FOR_CI),
                key=lambda r: -r.pooled.paired.speedup,
            )
            lines.append(_best_line(fw, sampling, ok, len(g) - len(ok)))
    return lines


def _best_line(fw: str, sampling: str, ok: list[HardwareRow], few: int) -> str:
    """One framework and sampling's best row (``ok``: rows with an interval, fastest first) in words."""
    if not ok:
        return (
            f"- **{fw}**, {sampling_text(sampling)}: none of its {few} rows at batch 1 has ≥ {MIN_PROMPTS_FOR_CI} paired "
            f"prompts (n too small), so no best method is named ({_link('hardware')})."
        )
    best = ok[0]
    e = Estimate.of(best.pooled)
    text = (
        f"- **{fw}**, {sampling_text(sampling)}: the fastest of {len(ok)} row{'s' if len(ok) > 1 else ''} at batch 1 with "
        f"≥ {MIN_PROMPTS_FOR_CI} paired prompts is {_row_name(best)} at {estimate_text(e)} over its paired AR "
        f"baseline (AL {fmt(best.pooled.acceptance.acceptance_length)}, n = {e.n} prompts): {wording.versus(e)}."
    )
    if len(ok) > 1:
        ru = ok[1]
        er = Estimate.of(ru.pooled)
        text += (
            f" Runner-up: {_row_name(ru)} at {estimate_text(er)}; the two intervals "
            + (
                "overlap, so which is faster is not resolved."
                if claims.overlap(e, er)
                else "are disjoint, so the best is faster than the runner-up."
            )
            + f" The best of {len(ok)} noisy rows is biased upward: read its speedup as optimistic."
        )
    if few:
        text += f" {few} row{'s' if few > 1 else ''} with fewer than {MIN_PROMPTS_FOR_CI} prompts not considered."
    return text + f" ({_link('hardware')})"


def _digest(case: str, sentences: list[str], link: str, most: int = 3) -> list[str]:
    """Up to ``most`` claims of one FAQ Q4 case as they stand in its section; beyond that, a pointer to it."""
    if len(sentences) <= most:
        return [f"- {case}: {s} ({_link(link)})." for s in sentences]
    return [f"- {case}: {s} ({_link(link)})." for s in sentences[:most]] + [
        f"- {case}: {len(sentences) - most} more row{'s' if len(sentences) - most > 1 else ''}, each decided from "
        f"its intervals, in {_link(link)}."
    ]


def where_it_loses(study: Study) -> list[str]:
    """The seed's FAQ Q4 reasons, each as this study measured it: observed, reversed, or cannot tell."""
    pc = faq.per_cell_acceptance(study)
    return (
        _digest("Batch (FAQ Q4 (1))", fails.batch_claims(study), "fails_batch")
        + _digest("Low α (FAQ Q4 (2))", fails.low_alpha_claims(study, pc), "fails_low_alpha")
        + _digest("Short outputs (FAQ Q4 (3))", fails.short_claims(study), "fails_short")
        # memory is the one case every row answers: one example in the summary, the rest in its table
        + _digest("Memory (FAQ Q4 (4))", fails.memory_claims(study), "fails_memory", most=1)
    )


def divergences(study: Study) -> list[str]:
    """Greedy speculative outputs that differ from their AR baseline, named with prompt, position and margin.

    A lossless method matches its greedy baseline token for token; where it does not, the reader is
    told where, and whether the target's own log-probabilities call it a near-tie.
    """
    groups: dict[tuple[str, str, Any], list[str]] = {}
    for c, m in study.cells.items():
        if m["method"] != "ar" and m["sampling"] == "greedy" and not m["synthetic"] and study.baseline(c):
            groups.setdefault((m["framework"], m["label"], m["gamma"]), []).append(c)
    lines, matched = [], 0
    for (fw, label, g), cells in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)):
        found: list[dict[str, Any]] = []
        n = 0
        for c in sorted(cells):
            pairs = metrics.paired_records(study.baseline(c), study.records.get(c, []))
            n += len(pairs)
            found += [{**d, "batch_size": study.meta(c)["batch_size"]} for d in row_parts.divergences(pairs)]
        if not found:
            matched += n
            continue
        name = f"{label} γ={g}" if g else str(label)
        lines.append(
            f"- **{fw}** {name}: {len(found)} of {n} paired greedy outputs differ from the AR baseline's (a lossless "
            f"method matches all). {wording.divergence_text(found)}"
        )
    if matched:
        lines.append(
            f"- {'The other' if lines else 'Every one of'} {matched} paired greedy speculative outputs matched "
            "their AR baseline token for token."
        )
    return lines


def caveats(study: Study, hw_rows: Sequence[HardwareRow]) -> list[str]:
    """What a reader must carry into a paper: model size, precision, n, sampling, hardware, synthetic rows."""
    cfg: dict[str, Any] = study.config
    params = study.model_params()
    sizes = ", ".join(
        f"{t.split('/')[-1]} {params[t] / 1e9:.2g} B parameters"
        for t in {p.get("target") for p in cfg.get("models", [])}
        if t in params
    )
    precisions = sorted({f"{r.framework}: {r.precision}" for r in hw_rows})
    samplings = sorted({sampling_text(m["sampling"]) for m in study.cells.values()})
    n = [r.pooled.sample.n_prompts for r in hw_rows if not r.is_ar]
    host = study.provenance.get("host", {})
    device = ", ".join(host.get("gpus") or []) or f"CPU ({host.get('cpu_model', '?')})"
    lines = [
        f"- Model size: {sizes or 'not declared'}. The seed's tables are for 7–70 B models on GPUs; acceptance "
        "carries over between hardware more than speed does.",
        f"- Precision per framework: {'; '.join(precisions) or '—'}; frameworks at different precisions differ "
        "in speed for that reason too.",
        f"- n: {min(n) if n else 0}–{max(n) if n else 0} distinct paired prompts per row; brackets are 95 % intervals over prompts "
        "(log-ratio t-intervals; a prompt's repeats averaged first; none printed below "
        f"{MIN_PROMPTS_FOR_CI} prompts)"
        + (
            ", with the run-to-run spread of repeats beside them"
            if any(m["repeat"] for m in study.cells.values())
            else ""
        ),
        f"- Sampling: {', '.join(samplings)}, identical for each method and its AR baseline.",
        f"- Measured on {device}.",
    ]
    synth = sorted({m["synthetic"] for m in study.cells.values() if m["synthetic"]})
    if synth:
        lines.append(
            f"- Rows marked *synthetic acceptance* ({', '.join(synth)}) time the system at a fixed acceptance; "
            "they count in no acceptance or quality figure."
        )
    return lines


def control_lines(study: Study) -> list[str]:
    """A caveat per A/A control whose interval excludes 1x: the measurement itself is biased there."""
    return [
        f"- **The A/A control of {r.framework} reads {r.speedup:.3f}× [{r.ci[0]:.3f}, {r.ci[1]:.3f}]**, "
        f"its interval excluding 1× (n = {r.n_prompts}): AR measured against itself was biased on this machine, "
        f"so {r.framework}'s speedups carry a bias of that size (see [Validity](#validity))."
        for r in control_rows(study)
        if r.excludes_one
    ]


def summary_markdown(
    study: Study,
    hw_rows: Sequence[HardwareRow],
    whole: Study | None = None,
    whole_rows: Sequence[HardwareRow] | None = None,
) -> str:
    """The summary from the hardware table's rows and the FAQ Q4 cases of ``study`` (the unflagged
    cells), each sentence linked to its table; the caveats describe ``whole`` (every cell), and a
    study whose speculative cells are all flagged says so instead of naming none."""
    left = bool(whole is not None and whole.flags)
    best = best_per_framework(hw_rows) or [
        "- every speculative row is flagged (see Validity): no best method is named"
        if left
        else "- no speculative cell measured"
    ]
    loses = where_it_loses(study) or [
        "- every speculative row is flagged (see Validity): no FAQ Q4 case is decided"
        if left
        else "- no row of this study tests the seed's FAQ Q4 cases"
    ]
    div = divergences(study)
    parts = [
        "**Best method per framework**\n",
        *best,
        "\n**When speculation does not pay: the seed's FAQ Q4 against this study**\n",
        *loses,
        *(["\n**Greedy outputs against their AR baseline**\n", *div] if div else []),
        "\n**Caveats**\n",
        *control_lines(whole or study),
        *caveats(whole or study, hw_rows if whole_rows is None else whole_rows),
    ]
    return "\n".join(parts) + "\n"
