"""The report's sections: analysis tables and figures put in order, with the text that explains them.

A :class:`Section` holds its markdown, its tables (name → display and raw frames) and its figures
(name → ``Figure``); the section builders compute nothing themselves beyond choosing what to show
(the numbers are :mod:`specstudy.analysis`'s).  :mod:`specstudy.report.writer` saves the tables
and figures under those names and renders the markdown.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pandas as pd

from ..analysis import engine_costs, faq, frames, rates, stats, trees
from ..analysis.rows import HardwareRow, hardware_rows, vouched_numbers
from ..analysis.study_records import Study, vouched
from ..frameworks import family_title
from ..layout import BUDGET_FILE
from . import across_engines, conditions, fails, figures, rate_tables, tables, tree_tables, wording
from .banner import rehearsal_banner
from .deploy import deploy_section
from .format import TASK_TITLES, fmt, fmt_ci
from .model_notes import note_text
from .published_section import published_section
from .report_body import body_sections
from .section_type import Section, markdown_table
from .summary import summary_markdown
from .validity_text import left_out_note, validity_section
from .workload import workload_sections

#: what the Pareto figures of a batch or rate sweep show (vLLM's sweep plots), said once for both sections
PARETO_TEXT = (
    "Throughput against per-request speed (Pareto figure): one point per {point}, one line per method "
    "with {ar} in black; y = total output tokens/s of the run, x = 1 / TPOT p50, the decode speed the "
    "median request sees (its prefill not counted). A point above and to the right of another is better on "
    "both; the dashed line joins the points no other point beats on both. Speculation pays where its line lies "
    "beyond AR's.\n"
)


def telemetry_section(study: Study) -> Section:
    """Temperatures, clocks, power and load over the run; throttled cells flagged."""
    sec = Section("Telemetry")
    table = tables.telemetry_table(study)
    if table.empty:
        sec.markdown = "_no telemetry recorded_\n"
        return sec
    sec.markdown = "\n".join(conditions.telemetry_lines(study, table)) + "\n"
    sec.tables["telemetry"] = (table, None)
    t = study.telemetry
    if t is not None and len(t) and "epoch" in t:
        sec.figures["telemetry"] = figures.telemetry(t, study.hardware)
    return sec


def hardware_section(study: Study) -> Section:
    """The appendix's hardware details: the rest of the seed's metric table for the headline rows, the
    trained drafters, telemetry (the headline table itself is the body's)."""
    prof = study.profile
    host = study.provenance.get("host", {})
    device = host.get("gpus") or [host.get("cpu_model", "")]
    metrics_table = tables.metric_table(study)
    sec = Section(
        f"Hardware — latency, memory, quality ({', '.join(d for d in device if d) or (prof.device if prof else '')})"
    )
    sec.tables["hardware_metrics"] = (metrics_table, None)
    notes = conditions.drafter_notes(study)
    sec.markdown = (
        "The rest of the seed's metric table for the headline rows: latency (mean / p50 / p99), tokens per target "
        "forward, memory overhead (peak of the speculative cell minus its baseline's), and quality (perplexity "
        "under the target minus the baseline's; the p value of a sign-flip test that both outputs score alike "
        "under the target; greedy exact match).\n\n"
        + markdown_table(metrics_table)
        + ("\nTrained drafters in this study:\n" + "\n".join(notes) + "\n" if notes else "")
    )
    sec.absorb(telemetry_section(study))
    return sec


def frameworks_section(study: Study) -> Section:
    fw = tables.framework_table(study)
    sec = Section(
        "Frameworks", "Measured per framework on this machine.\n\n" + markdown_table(fw), {"frameworks": (fw, None)}
    )
    same, same_raw = across_engines.acceptance_across_engines(study)
    if len(same):
        sec.add_table("acceptance_across_engines", same, same_raw, ACROSS_ENGINES_TEXT)
    return sec


ACROSS_ENGINES_TEXT = (
    "### The same drafter in several engines\n\n"
    "The same target, drafter, γ, prompts and sampling in each engine (FAQ Q3: a fair comparison uses the "
    "same checkpoints). Speed differs by engine; acceptance differs only where the engines draft differently: "
    "an EAGLE-3 head's feature layers and its draft-to-target vocabulary map as each engine reads them, a "
    "tree against a chain, prompt lookup's matching rule (which n-gram lengths, the first or the latest "
    "match), or the draft length an engine cuts at the output's end. *Across engines*, at greedy, compares "
    "each prompt's accepted tokens, drafted tokens and draft steps engine against engine, exactly (greedy "
    "decoding is deterministic): any accepted token of difference is named; drafting that differs no more than "
    "capping drafts at the tokens left can explain reads *identical acceptance; drafting differs at the end*. "
    "At T > 0 it compares every pair of AL intervals over prompts: disjoint intervals are a difference beyond "
    "noise; overlapping ones are not resolved (a conservative test). A mistake in the exported checkpoint "
    "itself (its vocabulary map, feature layers or norm) reaches every engine alike and shows in none of "
    "these comparisons: the export's round trip against the trained head catches it "
    "(`specstudy.engine.eagle3_drafter.check_round_trip`).\n\n"
)


def method_family_section(study: Study, family: str) -> Section:
    """The method-family notebook: across γ and batch size, measured beside the cost model."""
    table, raw = tables.method_table(study, family)
    sec = Section(f"Method family — {family_title(family)}", tables={f"method_{family}": (table, raw)})
    if raw.empty:
        sec.markdown = f"_no measured cells for family `{family}`_\n"
        return sec
    sec.markdown = (
        f"{family_title(family)} across γ and batch size; AL, the prediction and its note as in "
        "[Methods](#methods).\n\n" + markdown_table(table)
    )
    b1 = raw[raw["batch_size"] == 1]
    if len(b1):
        sec.figures[f"method_{family}_gamma"] = figures.speedup_vs_gamma(b1)
    hist = frames.al_histogram(study, study.spec_cell_ids(None, family=family))
    if hist:
        sec.figures[f"method_{family}_al_hist"] = figures.al_distribution(hist)
    # rows with a speedup only: a figure of none (every baseline missing, as in a rehearsal's heads rows)
    # has nothing on its log axis and failed the whole report at layout
    measured = raw[pd.to_numeric(raw["speedup"], errors="coerce").notna()]
    multi = measured.groupby(["label", "gamma"]).filter(lambda g: g["batch_size"].nunique() > 1)
    if len(multi):
        sec.figures[f"method_{family}_batch"] = figures.speedup_vs_batch(multi)
        sec.markdown += "\nBreak-even batch: " + "; ".join(wording.break_even_notes(multi)) + ".\n"
    sweep = tables.batch_sweep_frame(study, family)
    if len(sweep):
        sec.figures[f"method_{family}_pareto"] = figures.batch_pareto(sweep)
        sec.markdown += "\n" + PARETO_TEXT.format(point="batch size", ar="the paired AR cells at each batch size")
    if family == "tree" and study.has_sweep(trees.SWEEP):
        shapes, shapes_raw = tree_tables.tree_shape_table(study)
        sec.add_table("tree_shapes", shapes, shapes_raw, TREE_SHAPES_TEXT)
    return sec


TREE_SHAPES_TEXT = (
    "### Tree shapes at a matched node budget\n\n"
    "The same drafter(s), the same prompts and about the same number of drafted nodes per step, grown as a "
    "chain, with a fixed branching per depth, as SpecInfer's merge of several drafters' trees and as "
    "Sequoia's tree chosen by its dynamic program from the acceptance vector and this machine's "
    "verification-cost curve; and EAGLE-2's dynamic tree (the most confident nodes of an EAGLE drafter's "
    "top-k expansion, reranked within the node budget) beside the same drafter's chain: the seed's EAGLE-2 row "
    "is the tree, the chain reads *chain only*. *Seed row* is the seed's name for the method; the row says what ran. "
    "*AL expected* is a prediction (Sequoia: its DP's expected accepted tokens per step for the tree it "
    "chose; a chain: (1 − α̂^(γ+1)) / (1 − α̂) from the row's own α̂; a SpecInfer merge at greedy: the AL its "
    "drafters would reach together if their hits were independent, each at the depth its own tree matched in "
    "the same steps, so measured below expected means the drafters find the same tokens); *AL measured* is "
    "pooled over the row's prompts with its interval. A Sequoia row with *fixed budget* fills the node budget "
    "with the DP's tree; the other lets the cost curve choose the node count, which may be no tree at all "
    "when no tree pays on this machine. A row that loses to AR is read in *When speculation does not pay*.\n\n"
)


def task_category_section(study: Study, task: str | None = None) -> Section:
    """One task (or all): the seed's task table row(s) and the acceptance-vs-entropy plot."""
    name = f"task_{task}" if task else "tasks"
    table, raw = tables.task_table(study, [task] if task else None)
    sec = Section(
        f"Task category — {TASK_TITLES.get(task, task)}" if task else "Task categories", tables={name: (table, raw)}
    )
    sec.markdown = (
        "α range: lowest–highest α over the task's speculative cells (methods × γ), batch 1; entropy, best γ "
        "measured and optimal γ as in [Methods](#methods).\n\n" + markdown_table(table)
    )
    pts = frames.entropy_points(study, [task] if task else None)
    if len(pts) and task:  # all tasks together: the body's figure
        sec.figures[f"{name}_alpha_vs_entropy"] = figures.alpha_vs_entropy(pts, by_task=False)
        r = stats.entropy_correlation(pts)
        if r is not None:
            sec.markdown += f"\nPearson correlation of α with entropy over {len(pts)} requests: r = {r:.2f}.\n"
    return sec


def _fails_batch(study: Study, sec: Section) -> list[str]:
    parts = ["### (1) Large batch: the seed expects verification to turn compute-bound\n"]
    df = fails.large_batch(study)
    if len(df):
        sec.tables["fails_batch"] = (df, None)
        parts.append(markdown_table(df) + fails.claims_markdown(fails.batch_claims(study)))
    else:
        parts.append("_no method was measured at several batch sizes_\n")
    lines = fails.predicted_break_even(study, study.profile)
    if lines:
        parts.append(
            f"\nPrediction (roofline cost model, {study.profile.name} profile, not measured): batch size at "  # type: ignore[union-attr]
            "which the draft/target speedup falls below 1×:\n" + "\n".join(lines) + "\n"
        )
    else:
        parts.append("")
    return parts


def _fails_alpha(study: Study, sec: Section) -> list[str]:
    parts = ["\n### (2) Low acceptance (α < 0.4)\n"]
    pc = faq.per_cell_acceptance(study)
    if not len(pc):
        return parts + ["_no speculative cell with both α and a paired baseline_\n"]
    df = fails.low_alpha(study, pc)
    sec.tables["fails_low_alpha"] = (df, None)
    parts.append(markdown_table(df) + fails.claims_markdown(fails.low_alpha_claims(study, pc)))
    preds = fails.low_alpha_predictions(pc)
    if preds:
        parts.append(
            "\nPrediction (cost model with each method's measured draft and verification costs):\n"
            + "\n".join(preds)
            + "\n"
        )
    sec.figures["fails_alpha"] = figures.speedup_vs_alpha(pc)
    return parts


def _fails_short_and_memory(study: Study, sec: Section) -> list[str]:
    parts = ["\n### (3) Short outputs (≤ 10 tokens)\n"]
    df = fails.short_outputs(study)
    if len(df):
        sec.tables["fails_short"] = (df, None)
        parts.append(
            "The seed expects less speedup here: the prefill and the first token are the same work with or without "
            "speculation, so with few output tokens less decode time is left to save.\n\n"
            + markdown_table(df)
            + fails.claims_markdown(fails.short_claims(study))
        )
    else:
        parts.append("_no short-output cells in this study (add a sweep with max_new_tokens ≤ 10)_\n")
    parts.append("\n### (4) Memory pressure: the seed expects a draft model to cost memory the target may need\n")
    md, src = fails.memory_overhead(study)
    if len(md):
        sec.tables["fails_memory"] = (md, None)
        parts.append(
            f"Peak memory of the speculative cell minus its paired baseline (source: {', '.join(src) or 'backend'}), "
            "read against what the measurement resolves: the spread of the cells' own per-request peaks, a few MB "
            "for process memory (RSS, NVML), and the largest negative difference measured with the same source "
            "(speculation adds state, so a cell peaking below its baseline shows the noise).\n\n"
            + markdown_table(md)
            + fails.claims_markdown(fails.memory_claims(study))
        )
    else:
        parts.append("_the backend reported no peak memory_\n")
    lines = fails.predicted_memory_fit(study, study.profile)
    parts.append(
        "\nPrediction (weights only, from declared parameter counts; KV cache comes on top): heads "
        "(Medusa/EAGLE) add far less memory than a separate draft model.\n" + "\n".join(lines) + "\n"
        if lines
        else ""
    )
    return parts


def when_it_fails_section(study: Study, whole: Study | None = None) -> Section:
    """FAQ Q4: large batch, α < 0.4, outputs under 10 tokens, memory pressure — measured where the
    records allow it, the cost model's prediction beside it (labelled as a prediction); ``study`` holds
    the unflagged cells, ``whole`` (every cell) says what was left out."""
    sec = Section("When speculation does not pay (FAQ Q4)")
    parts = _fails_batch(study, sec) + _fails_alpha(study, sec) + _fails_short_and_memory(study, sec)
    sec.markdown = left_out_note(whole, "every verdict below") + "\n".join(parts)
    return sec


def serving_section(study: Study) -> Section:
    """FAQ Q2: the request-rate sweep on servers, where speculation stops paying, the sender's
    schedule, and the prefix cache off and on with the engine's own hit counts."""
    sec = Section("Serving: request-rate sweep and prefix cache")
    raw = rates.rate_frame(study)
    parts: list[str] = []
    if raw.empty:
        parts.append("_no request-rate cells in this study (add `request_rates` to a sweep of a server framework)_\n")
    else:
        slo = rates.study_slo(study)
        slo_text = (
            f"{slo.describe()} (the seed's FAQ Q1 figure for comfortable chat; the default SLO)"
            if slo == rates.DEFAULT_SLO
            else f"{slo.describe()} (the study's `slo`; the seed's default is {rates.DEFAULT_SLO.describe()})"
        )
        table = rate_tables.rate_table(raw)
        sec.tables["serving_rates"] = (table, raw)
        stop = rate_tables.stops_paying_table(raw)
        sec.tables["serving_stops_paying"] = (stop, None)
        sec.figures["serving_throughput_latency"] = figures.throughput_latency(raw)
        sec.figures["serving_pareto"] = figures.rate_pareto(raw, slo.tpot_s)
        parts += [
            "Requests offered by the kit's asyncio load generator (Poisson arrivals at each rate; inf: all at "
            "once). Throughputs over the run's span; TTFT and TPOT p50 / p99 over ok requests; goodput = requests/s "
            f"meeting {slo_text}. "
            "Mean running batch: the engine's own gauge (vLLM `vllm:num_requests_running`, llama.cpp "
            "`llamacpp:requests_processing`) averaged over samples taken every 0.5 s while the run lasted. Send "
            "lag: actual − scheduled send time per request (the sender's own delay, not server queueing). Speedup: "
            "paired AR E2E latency / speculative, same prompts at the same rate (none for a probe cut short). Peak "
            "memory: the server process tree's RSS (NVML device memory on GPUs). _cut_: a capacity search's probe "
            "stopped once its SLO was broken whatever its other requests did; its figures cover what ran until then.\n",
            markdown_table(table),
            "\nWhere speculation stops paying (the lowest offered rate whose paired speedup ≤ 1):\n",
            markdown_table(stop),
            "\n" + PARETO_TEXT.format(point="offered rate", ar="AR at the same rates"),
        ]
    pc_raw = rates.prefix_cache_frame(study)
    parts.append("\n### Prefix cache off and on\n")
    if pc_raw.empty:
        parts.append("_no cells ran with the prefix cache both off and on_\n")
    else:
        pc = rate_tables.prefix_cache_table(pc_raw)
        sec.tables["serving_prefix_cache"] = (pc, pc_raw)
        parts += [
            "Lookups and hits are the engine's own counters over each run (vLLM "
            "`vllm:prefix_cache_queries_total` / `vllm:prefix_cache_hits_total`, in tokens; offline "
            "`llm.get_metrics()`); — where an engine reports none. A server the kit did not start has an unknown "
            "setting and is not listed.\n",
            markdown_table(pc),
        ]
    sec.markdown = "\n".join(parts)
    return sec


def hygiene_section(study: Study) -> Section:
    """The seed's benchmark-hygiene table, answered from the records and the plan."""
    if not study.records:
        return Section("Benchmark hygiene", "_no records_\n")
    return Section("Benchmark hygiene", markdown_table(conditions.hygiene_table(study)))


def provenance_section(study: Study) -> Section:
    return Section("Provenance", "\n".join(conditions.provenance_lines(study)) + "\n")


def failures_section(study: Study) -> Section:
    if not study.failed:
        return Section("Failed cells", "None.\n")
    lines = ["| Cell | Error |", "| --- | --- |"]
    for f in study.failed:
        lines.append(f"| {f.get('cell_id')} | {str(f.get('error', '')).replace('|', '/')[:200]} |")
    return Section(
        "Failed cells", "\n".join(lines) + "\n\nRerun `make study` to retry them (finished cells are skipped).\n"
    )


def report_head(study: Study) -> str:
    # the A/A controls are cells of the plan too, kept apart from the rows (Study.controls)
    measured = [*study.records.values(), *study.controls.values()]
    n_req = sum(len(v) for v in measured)
    n_ok = sum(r.status == "ok" for v in measured for r in v)
    stale = (
        f"; {len(study.stale_cells)} record part(s) of cells no longer in the params ignored"
        if study.stale_cells
        else ""
    )
    budget = study.out / BUDGET_FILE
    cut = json.loads(budget.read_text()) if budget.is_file() else None
    cut_line = (
        f"**Cut by the budget** (`--budget-min {cut['budget_min']:g}`, the profile's sweep order): "
        f"{', '.join(cut['cut'])} not run; {', '.join(cut['kept'])} run.\n"
        if cut and cut["cut"]
        else ""
    )
    return "\n".join(
        [
            *filter(None, [rehearsal_banner(study.out)]),
            f"# Speculative decoding study — `{study.config.get('name', study.hardware)}` on `{study.hardware}`\n",
            f"{len(measured)} of {study.planned_cells} planned cells measured ({n_req} requests, {n_ok} ok); "
            f"{len(study.failed)} failed{stale}. Every number is measured on this machine unless labelled "
            "*prediction*; definitions in [Methods](#methods). The body ends at [Appendix](#appendix).\n",
            *filter(None, [cut_line]),
        ]
    )


def summary_section(
    study: Study,
    hw_rows: Sequence[HardwareRow],
    whole: Study | None = None,
    whole_rows: Sequence[HardwareRow] | None = None,
) -> Section:
    """The opening summary, computed from the report's own tables (each sentence links to its table),
    over ``study``'s cells (the unflagged ones); ``whole`` (every cell) says what it leaves out and why."""
    return Section(
        "Summary", left_out_note(whole, "every line below") + summary_markdown(study, hw_rows, whole, whole_rows)
    )


def _worded_notes(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows with their model note in words (— where no assumption is bent; empty without a prediction)."""
    words = [note_text(b) if b is not None else "" for b in rows["model_bends"]]
    return rows.assign(model_bends=words).rename(columns={"model_bends": "model_note"})


def engine_costs_section(study: Study) -> Section | None:
    """llama.cpp's own T(k)/T(1) and c, and each llama.cpp row's speedup beside the cost model's."""
    curves = engine_costs.cost_curves(study)
    if not len(curves):
        return None
    rows = _worded_notes(engine_costs.predicted_rows(study))
    shown = rows.assign(
        label=[lab + tables.flag_mark(study, cells) for lab, cells in zip(rows["label"], rows["cells"])],
        alpha=rows["alpha"].map(fmt),
        alpha_hat=rows["alpha_hat"].map(fmt),
        c=rows["c"].map(lambda x: fmt(x, 3)),
        verify_ratio=rows["verify_ratio"].map(fmt),
        prefill_share=rows["prefill_share"].map(fmt),
        speedup=[fmt_ci(s, ci, suffix="×", n=n) for s, ci, n in zip(rows["speedup"], rows["speedup_ci"], rows["n"])],
        predicted_speedup=rows["predicted_speedup"].map(lambda x: fmt(x, suffix="×")),
        measured_over_predicted=rows["measured_over_predicted"].map(fmt),
    ).drop(columns=["speedup_ci", "cells"])
    curve = curves.assign(verify_ratio=curves["verify_ratio"].map(fmt), verify_ms=curves["verify_ms"].map(fmt))
    cs = sorted({f"{d}: c = {fmt(c, 3)}" for d, c in zip(curves["drafter"], curves["c"]) if d and c == c})
    sec = Section("llama.cpp's own step costs (FAQ case 1)")
    sec.markdown = (
        "Measured by the study after its cells, with llama.cpp's own timings: T(k) is one forward over k new tokens "
        "on a cached prompt (`timings.prompt_ms` with `prompt_n` = k; it computes the last position's logits only, "
        "so it slightly under-states a verification forward), T(k)/T(1) its ratio to one token; c = the draft "
        "model's decode time per token / the target's. The cost model's GPU regime assumes T(γ+1)/T(1) ≈ 1; "
        "where it grows nearly linearly, every rejected draft costs almost a full decode step and draft-model "
        "speculation loses even at high α. "
        + (("Draft cost: " + "; ".join(cs) + ". ") if cs else "")
        + "Decode prediction s = (1 − α̂^(γ+1)) / ((1 − α̂)(γ c + T(γ+1)/T(1))) from each row's measured α̂ "
        "(n-gram drafting: c = 0); speculation leaves the prompt's prefill alone, and a draft model reads the "
        "prompt too (its prompt pass taken as c of the target's), so the request-level prediction beside the "
        "measured E2E speedup is 1 / (f (1 + c) + (1 − f) / s) for a draft model and 1 / (f + (1 − f) / s) for "
        "n-gram drafting, f = the AR baseline's measured share of E2E before the first token (prefill_share).\n\n"
        + markdown_table(curve)
        + "\n"
        + markdown_table(shown)
    )
    sec.tables["engine_costs_curve"] = (curve, curves)
    sec.tables["engine_costs_rows"] = (shown, rows)
    sec.figures["engine_costs_curve"] = figures.verification_cost_curve(curves)
    return sec


def report_parts(study: Study) -> tuple[list[Section], list[Section]]:
    """The main body (:mod:`.report_body`) and the appendix: every other section, in order."""
    hw_rows = hardware_rows(study)
    clean = vouched(study) if study.flags else study
    clean_rows = hardware_rows(clean) if study.flags else hw_rows
    hardware = tables.hardware_table(study, rows=vouched_numbers(hw_rows, clean_rows))  # the summary's numbers
    summary = summary_section(clean, clean_rows, study, hw_rows)
    published = published_section(study)  # a GPU profile's results open with its published references
    body = body_sections(study, summary, hardware, published)
    secs = [validity_section(study), hardware_section(study), frameworks_section(study)]
    secs += [method_family_section(study, fam) for fam in tables.families_in(study)]
    costs = engine_costs_section(study)
    secs += [costs] if costs is not None else []
    secs += [
        task_category_section(study),
        when_it_fails_section(clean, study),  # verdicts from unflagged cells only
    ]
    serving = serving_section(study)
    if serving.tables:  # a study without servers or prefix-cache pairs has no such section
        secs.append(serving)
    secs.append(deploy_section(clean, study))  # the decisions: from unflagged cells only
    secs += workload_sections(study)
    secs += [
        hygiene_section(study),
        provenance_section(study),
        failures_section(study),
    ]
    return body, secs


def report_sections(study: Study) -> list[Section]:
    """Every section of the report, body then appendix."""
    body, appendix = report_parts(study)
    return [*body, *appendix]


def extra_sections(study: Study) -> list[Section]:
    """Sections the report does not print but whose tables and figures the task notebooks show."""
    return [task_category_section(study, t) for t in tables.tasks_in(study)]
