"""The report's opening summary: sentences computed from its own tables, each linked to the table it quotes.

Nothing here is written by hand: every figure comes from the raw frames of
:mod:`specstudy.analysis` (best method per framework, where speculation lost and the cost
model's reason, the study's size and precision), so the summary changes when the records do.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..analysis import fails
from ..analysis.format import fmt, fmt_ci
from ..analysis.stats import isnum
from ..analysis.study import Study
from ..metrics import MIN_PROMPTS_FOR_CI


def _link(name: str) -> str:
    return f"[{name}](tables/{name}.md)"


def best_per_framework(hw_raw: pd.DataFrame) -> list[str]:
    """Per framework: its fastest measured method at batch 1, with the CI and n."""
    lines = []
    spec = hw_raw[(hw_raw["method"] != "ar") & hw_raw["synthetic"].isna()] if len(hw_raw) else hw_raw
    for fw, g in spec.groupby("framework") if len(spec) else []:
        g = g[g["speedup"].map(isnum)]
        if not len(g):
            continue
        r = g.loc[g["speedup"].idxmax()]
        verdict = (
            "faster than"
            if r["speedup_ci"][0] > 1
            else ("slower than" if r["speedup_ci"][1] < 1 else "not distinguishable from")
        )
        lines.append(
            f"- **{fw}**: the best method at batch 1 is {r['label']} (γ={r['gamma']}, {r['sampling']}) at "
            f"{fmt_ci(r['speedup'], r['speedup_ci'], 2, '×')} over its paired AR baseline, {verdict} AR "
            f"(AL {fmt(r['acceptance_length'])}, n = {r['n_prompts']} paired prompts; {_link('hardware')})."
        )
    return lines


def where_it_loses(study: Study, hw_raw: pd.DataFrame) -> list[str]:
    """Where speculation lost, and which of the seed's FAQ Q4 reasons the records show."""
    lines = []
    pc = fails.per_cell_acceptance(study)
    if len(pc):
        slower = pc[pc["speedup"] < 1]
        low = slower[slower["alpha"] < 0.4]
        lines.append(
            f"- {len(slower)} of {len(pc)} speculative cells at batch 1 were slower than AR; {len(low)} of "
            f"those had α < 0.4, where drafting costs more than the accepted tokens save ({_link('fails_low_alpha')})."
        )
    batch = fails.large_batch(study)
    if len(batch):
        lines.append(
            f"- Across batch sizes the speedup changes as {_link('fails_batch')} shows: verification turns "
            "compute-bound as batch × (γ + 1) grows (FAQ Q4 (1))."
        )
    short = fails.short_outputs(study)
    if len(short):
        col = next(c for c in short.columns if c.startswith("Speedup short"))
        worst = short.iloc[0]
        lines.append(
            f"- With ≤ 10 output tokens, {worst['Method']} ran at {worst[col]}: the prefill and first token "
            f"are the same work with or without speculation ({_link('fails_short')})."
        )
    return lines


def caveats(study: Study, hw_raw: pd.DataFrame) -> list[str]:
    """What a reader must carry into a paper: model size, precision, n, sampling, hardware, synthetic rows."""
    cfg: dict[str, Any] = study.config
    params = study.model_params()
    sizes = ", ".join(
        f"{t.split('/')[-1]} {params[t] / 1e9:.2g} B parameters"
        for t in {p.get("target") for p in cfg.get("models", [])}
        if t in params
    )
    precisions = sorted({f"{r['framework']}: {r['precision']}" for _, r in hw_raw.iterrows()}) if len(hw_raw) else []
    samplings = sorted({m["sampling"] for m in study.cells.values()})
    n = [int(r["n_prompts"]) for _, r in hw_raw.iterrows() if r["method"] != "ar"] if len(hw_raw) else []
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


def summary_markdown(study: Study, hw_raw: pd.DataFrame) -> str:
    best = best_per_framework(hw_raw) or ["- no speculative cell measured"]
    loses = where_it_loses(study, hw_raw) or ["- no losing cell measured"]
    parts = [
        "**Best method per framework**\n",
        *best,
        "\n**Where speculation loses**\n",
        *loses,
        "\n**Caveats**\n",
        *caveats(study, hw_raw),
    ]
    return "\n".join(parts) + "\n"
