"""The report's deployment section: capacity under the SLO, γ per load, cost and energy per token.

Each part prints only what the study measured; a part without its cells says which sweep it needs.
The numbers are :mod:`specstudy.analysis.capacity`, ``gamma_schedule`` and ``cost``'s.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..analysis import capacity, cost, gamma_schedule, rates, schedule_vs_fixed, structured
from ..analysis.study_records import Study
from ..intervals import MIN_PROMPTS_FOR_CI
from .format import fmt, fmt_ci, sampling_text
from .section_type import Section, markdown_table
from .validity_text import left_out_note


def _has_interval(row: Mapping[str, Any]) -> bool:
    return row.get("capacity_ci_low") == row.get("capacity_ci_low") and "capacity_ci_low" in row


def capacity_value(row: Mapping[str, Any], prefix: str = "") -> str:
    """The capacity as a value or a bound: ``0.827 req/s``, ``≥ 5.3 req/s`` (a repeat never broke),
    ``< 0.539 req/s`` (a repeat broke at every rate probed: below the lowest). ``prefix``: ``ar_`` reads
    the AR row's counts that :func:`specstudy.analysis.capacity.beside_ar` carries."""
    if int(row.get(f"{prefix}repeats_never_broke") or 0):
        return f"≥ {row[f'{prefix}capacity_rps']:.3g} req/s"
    if int(row.get(f"{prefix}repeats_never_held") or 0):
        return f"< {min(row.get(f'{prefix}rates') or [math.nan]):.3g} req/s"
    return f"{row[f'{prefix}capacity_rps']:.3g} req/s"


def capacity_text(row: Mapping[str, Any]) -> str:
    """``2.5 req/s [2.1, 2.9] over 5 repeats; breaks at 3``, or with fewer repeats than an interval needs
    ``2 req/s (not enough repeats for an interval: 3, needs ≥ 5; breaks at 3)``."""
    n = int(row["repeats"])
    unbroken = int(row.get("repeats_never_broke") or 0)
    never_held = int(row.get("repeats_never_held") or 0)
    spread = (
        f"[{row['capacity_ci_low']:.3g}, {row['capacity_ci_high']:.3g}] over {n} repeats"
        if _has_interval(row)
        else f"a lower bound: {unbroken} of {n} repeats never broke, so no interval"
        if unbroken
        else f"an upper bound: {never_held} of {n} repeats broke at every rate probed, so no interval"
        if never_held
        else f"not enough repeats for an interval: {n}, needs ≥ {MIN_PROMPTS_FOR_CI}"
    )
    cap = capacity_value(row)
    broke = (
        "never broke up to the highest rate probed"
        if math.isinf(row["breaks_at_rps"])
        else f"breaks at {row['breaks_at_rps']:g}"
    )
    widest = row.get("widest_bracket")
    if widest is not None and widest == widest and not math.isinf(widest):
        broke += f", widest repeat's bracket {widest:.2f}×"
    unsteady = int(row.get("unsteady_probes") or 0)
    steady = f"; {unsteady} probe(s) with a queue still growing" if unsteady else ""
    lengthened = int(row.get("lengthened_probes") or 0)
    steady += f"; {lengthened} probe(s) rerun longer for a steady queue" if lengthened else ""
    cut = int(row.get("cut_probes") or 0)
    steady += f"; {cut} probe(s) stopped once broken" if cut else ""
    return f"{cap} ({spread}; {broke}{steady})"


def schedule_lines(frame: pd.DataFrame) -> list[str]:
    """The recommended schedule per (engine, method, task) in words, e.g. "γ 4 up to batch 2, γ 2 up to batch 8"."""
    lines: list[str] = []
    if frame.empty:
        return lines
    for key, g in frame.groupby(list(gamma_schedule.SCHEDULE_KEY), sort=True, dropna=False):
        parts = [f"{'off' if c == 'off' else f'γ {c}'} up to batch {b}" for c, b in gamma_schedule.runs(g)]
        open_calls = [int(b) for b, sep in zip(g["batch_size"], g["separated"]) if sep is not True]
        tail = (
            f"; the data cannot separate the choice from the runner-up at batch {', '.join(map(str, open_calls))}"
            if open_calls
            else ""
        )
        lines.append(f"{key[0]} {key[1]} on {key[2]}: " + ", ".join(parts) + tail + ".")
    return lines


def energy_notes(read: cost.EnergyRead) -> list[str]:
    """What energy the study read, and why not where it could not (said, never estimated)."""
    notes = []
    if read.gpu:
        notes.append(
            "GPU energy: NVML's total-energy counter (last − first sample of each cell, summed over every GPU NVML "
            "sees on the machine, idle ones included: a cell on fewer GPUs than the node has is charged for all)."
        )
    elif read.gpu_machine:
        notes.append("GPU energy: not readable (NVML gave no total-energy counter on this machine); no GPU J/token.")
    if read.cpu:
        notes.append("CPU energy: RAPL package counters (`/sys/class/powercap`), over the cell's measured requests.")
    else:
        why = f" ({'; '.join(read.cpu_unavailable)})" if read.cpu_unavailable else " (no telemetry recorded a reading)"
        notes.append(
            "CPU energy: RAPL not readable on this machine"
            + why
            + ", so no CPU J/token is shown; the kit never estimates it from power × time."
        )
    return notes


def price_note(price: cost.Price | None) -> str:
    if price is None:
        return (
            "No price per hour stated for this machine: $ per million tokens is not computed "
            "(add `price:` to the hardware profile or pass `specstudy report --price-per-hour USD`)."
        )
    return (
        f"Price: US$ {price.usd_per_gpu_hour:g} per {price.per} ({price.date}; {price.source}); "
        f"$ per million output tokens = price{' × GPUs' if price.per == 'GPU-hour' else ''} / 3600 / measured "
        "output tokens per s, at the row's TPOT p50."
    )


def engines_shown(frame: pd.DataFrame) -> pd.DataFrame:
    """The engines' structured-output declarations as the report shows them."""
    combine = {True: "yes", False: "no", None: "not documented"}
    return pd.DataFrame(
        {
            "Framework": frame["framework"],
            "Constraint fields": frame["fields"].map(lambda d: ", ".join(f"{k}: `{v}`" for k, v in d.items()) or "—"),
            "With speculation": frame["with_speculation"].map(
                lambda v: combine[None if v is None or v != v else bool(v)]
            ),
            "Source": frame["source"].map(lambda s: s or "—"),
        }
    )


def _capacity(study: Study, sec: Section) -> list[str]:
    slo = rates.study_slo(study)
    frame = capacity.capacity_frame(study, slo)
    head = "### Capacity under the SLO\n"
    if frame.empty:
        return [
            head,
            "_no request-rate cells with Poisson arrivals in this study (a serving sweep's `request_rates`)_\n",
        ]
    side = capacity.beside_ar(frame)
    shown = pd.DataFrame(
        {
            "Framework": frame["framework"],
            "Method": frame["label"],
            "Task": frame["task"],
            "New tokens": frame["max_new_tokens"],
            "γ": frame["gamma"].map(lambda g: "—" if g is None or g != g else f"{g:g}"),
            "Capacity": [capacity_text(r) for r in frame.to_dict("records")],
            "Rates probed (req/s)": frame["rates"].map(
                lambda rs: ", ".join("inf" if math.isinf(r) else f"{r:g}" for r in rs)
            ),
        }
    )
    sec.tables["deploy_capacity"] = (shown, frame)
    lines = [
        head,
        f"The highest offered rate (Poisson arrivals) at which {slo.describe_percentile()} held at that rate and every "
        "lower one probed, per repeat of the sweep; the first rate where it broke bounds it from above. "
        "TTFT and E2E count from each request's arrival: a request that waited for a free slot at the "
        "client (the cell's batch size caps the requests in flight) waited as a user would. "
        "`specstudy run --refine-capacity N` bisects each repeat's bracket geometrically before the report, and "
        "extends the grid by one of its steps where a repeat broke at its lowest rate or never broke. A probe whose "
        "last third of requests waited over twice as long for a first token as its first third had a queue still "
        "growing, and one whose arrivals spanned less than its median request's latency was a burst (neither is "
        "stationary: its percentiles depend on how long it ran); where such a probe held the SLO at "
        "its repeat's capacity, each refining round reruns it with twice "
        f"the prompts, up to {capacity.LONGEST_PROBE_GROWTH} times the configured count, the longer probe replacing "
        "the shorter; the capacity names how many were rerun and how many stayed unsteady. A probe stops once so "
        "many of its requests have waited past the TTFT (or E2E) limit that the percentile is broken whatever "
        "the rest do (p90 of 12 requests: 3); its requests still in flight are cut and count as failed, which "
        "leaves the verdict where it was. The capacity is "
        "the geometric mean over repeats of the sweep with a 95 % t-interval on the log scale (a rate is positive: "
        "both bounds stay above zero), the repeat being the unit (a capacity is not a "
        f"per-prompt statistic); below {MIN_PROMPTS_FOR_CI} repeats no interval is given, nor where a repeat broke "
        "the SLO at every rate probed (the capacity is below the lowest).\n",
        markdown_table(shown),
    ]
    for r in side.to_dict("records"):
        if r["ar_capacity_rps"] == r["ar_capacity_rps"]:
            verdict = (
                "not comparable with a bound:"
                if int(r.get("ar_repeats_never_broke") or 0) or int(r.get("ar_repeats_never_held") or 0)
                else "a lower bound (it never broke), not comparable with"
                if int(r.get("repeats_never_broke") or 0)
                else "an upper bound (a repeat broke at every rate probed), not comparable with"
                if int(r.get("repeats_never_held") or 0)
                else "not enough repeats to tell it from"
                if not _has_interval(r)
                else "more than"
                if r["capacity_ci_low"] > r["ar_capacity_rps"]
                else "less than"
                if r["capacity_ci_high"] < r["ar_capacity_rps"]
                else "not separable from"
            )
            lines.append(
                f"- {r['framework']} {r['label']} on {r['task']}: capacity {capacity_value(r)}, {verdict} AR's "
                f"{capacity_value(r, 'ar_')}.\n"
            )
    return lines


def _gamma(study: Study, sec: Section) -> list[str]:
    frame = gamma_schedule.gamma_schedule(study)
    head = "### γ per load\n"
    if frame.empty:
        return [
            head,
            "_no batch size measured at two or more γ for one method (a sweep with several `gammas` and `batch_sizes`)_\n",
        ]
    shown = pd.DataFrame(
        {
            "Framework": frame["framework"],
            "Method": frame["label"],
            "Task": frame["task"],
            "Batch": frame["batch_size"],
            "γ measured": frame["gammas"].map(lambda gs: ", ".join(map(str, gs))),
            "Chosen γ": frame["chosen"],
            "Robust speedup": frame["score"].map(lambda x: fmt(x, suffix="×")),
            "Runner-up": frame["runner_up"],
            "Separated": frame["separated"].map({True: "yes", False: "no"}).fillna("n too small"),
            "Cost model's γ": frame["predicted_gamma"],
            "Rests on": frame["rests_on"].map(lambda cs: f"{len(cs)} cells"),
        }
    )
    sec.tables["deploy_gamma_schedule"] = (shown, frame)
    return [
        head,
        "Per batch-size bucket, each measured γ scored by its paired speedup's median − 1.4826 × MAD over repeats "
        "(vLLM's tuner's conservative score; one repeat: its speedup), AR scoring 1: γ off when none beats it. "
        "*Separated*: whether the chosen setting's 95 % interval over prompts is disjoint from the runner-up's. "
        "*Cost model's γ*: the best measured γ by the cost model from each row's own α̂, c and verification cost. "
        "The cells behind each row are in `tables/deploy_gamma_schedule.csv`.\n",
        markdown_table(shown),
        "\nSchedule:\n",
        *[f"- {line}\n" for line in schedule_lines(frame)],
    ]


def load_text(batch_size: Any, request_rate: Any) -> str:
    """A load in words: ``batch 16`` (a closed batch) or ``8 req/s`` (arrivals at a rate)."""
    return (
        f"batch {int(batch_size)}"
        if request_rate is None or request_rate != request_rate
        else f"{float(request_rate):g} req/s"
    )


def schedule_verdict_text(verdict: str, best_gamma: Any) -> str:
    """A :mod:`specstudy.analysis.schedule_vs_fixed` verdict in words."""
    return {
        schedule_vs_fixed.SCHEDULE_AHEAD: "schedule ahead",
        schedule_vs_fixed.FIXED_AHEAD: f"fixed γ {best_gamma} ahead",
        schedule_vs_fixed.CANNOT_SEPARATE: "cannot separate",
        schedule_vs_fixed.NO_INTERVAL: "n too small for an interval",
        schedule_vs_fixed.NO_FIXED: "no fixed γ measured at this load",
    }[verdict]


def _engine_schedules(study: Study, sec: Section) -> list[str]:
    """The engines' own γ schedules beside the best fixed γ per load (nothing when no row ran one)."""
    frame = schedule_vs_fixed.schedule_vs_fixed(study)
    if frame.empty:
        return []
    shown = pd.DataFrame(
        {
            "Framework": frame["framework"],
            "Schedule": frame["label"],
            "Task": frame["task"],
            "Load": [load_text(b, r) for b, r in zip(frame["batch_size"], frame["request_rate"])],
            "Schedule's speedup": [
                fmt_ci(x, ci, suffix="×") for x, ci in zip(frame["schedule_speedup"], frame["schedule_ci"])
            ],
            "Fixed γ measured": frame["fixed_gammas"].map(lambda gs: ", ".join(map(str, gs)) or "—"),
            "Best fixed γ": frame["best_gamma"].map(lambda g: "—" if g is None or g != g else str(int(g))),
            "Its speedup": [fmt_ci(x, ci, suffix="×") for x, ci in zip(frame["best_speedup"], frame["best_ci"])],
            "Verdict": [
                schedule_verdict_text(v, "—" if g is None or g != g else int(g))
                for v, g in zip(frame["verdict"], frame["best_gamma"])
            ],
            "Rests on": frame["rests_on"].map(lambda cs: f"{len(cs)} cells"),
        }
    )
    sec.tables["deploy_engine_schedule"] = (shown, frame)
    return [
        "### The engine's schedule vs the best fixed γ per load\n",
        "Each engine's own choice of γ (vLLM's γ per batch size, SGLang's adaptive steps, TensorRT-LLM's "
        "draft_len_schedule, HF's heuristic schedule) beside the best fixed γ measured at the same load, chosen "
        "by the robust score above; speedups paired against AR with 95 % intervals over prompts. *Cannot "
        "separate*: the intervals overlap. The cells behind each row are in `tables/deploy_engine_schedule.csv`.\n",
        markdown_table(shown),
    ]


def _structured(study: Study, sec: Section) -> list[str]:
    raw_engines = structured.engines_table()
    engines = engines_shown(raw_engines)
    sec.tables["deploy_structured_engines"] = (engines, raw_engines)
    lines = [
        "### Structured outputs under speculation\n",
        "Which engines combine constrained decoding with speculation (their declarations, with the source):\n",
        markdown_table(engines),
    ]
    frame = structured.structured_frame(study)
    if frame.empty:
        return lines + ["\n_no task in this study states a `structured_output` (a JSON schema or grammar)_\n"]
    ci = zip(frame["acceptance_length"], frame["acceptance_length_ci"], frame["n_prompts"])
    sp = zip(frame["speedup"], frame["speedup_ci"], frame["n_prompts"])
    shown = pd.DataFrame(
        {
            "Framework": frame["framework"],
            "Method": frame["label"],
            "Task": frame["task"],
            "γ": frame["gamma"],
            "α": frame["alpha"].map(fmt),
            "AL": [fmt_ci(a, c, n=n) for a, c, n in ci],
            "Speedup": [fmt_ci(s, c, suffix="×", n=n) for s, c, n in sp],
            "Valid (spec)": [f"{fmt(s)} of {n}" for s, n in zip(frame["valid_share"], frame["valid_judged"])],
            "Valid (AR)": [f"{fmt(s)} of {n}" for s, n in zip(frame["ar_valid_share"], frame["ar_valid_judged"])],
        }
    )
    sec.tables["deploy_structured"] = (shown, frame)
    return lines + [
        "\nEvery request of these tasks carried the task's constraint, with and without speculation, on the same "
        "prompts. *Valid*: outputs that parse as JSON and meet the schema (jsonschema), of those judged (outputs cut "
        "at max_new_tokens are not judged; a grammar task is enforced by the engine and not re-parsed).\n",
        markdown_table(shown),
    ]


def _cost(study: Study, sec: Section) -> list[str]:
    slo = rates.study_slo(study)
    frame = cost.cost_energy_frame(study, slo.tpot_ms)
    lines = ["### Cost and energy per output token\n", *[f"- {n}\n" for n in energy_notes(cost.energy_read(study))]]
    lines.append(f"- {price_note(cost.price_of(study))}\n")
    if frame.empty:
        return lines
    shown = pd.DataFrame(
        {
            "Framework": frame["framework"],
            "Method": frame["label"],
            "Task": frame["task"],
            "γ": frame["gamma"].map(lambda g: "—" if g is None or g != g else f"{g:g}"),
            "Batch": frame["batch_size"],
            "New tokens": frame["max_new_tokens"],
            "Sampling": frame["sampling"].map(sampling_text),
            "Rate": frame["request_rate"].map(lambda r: "—" if r is None or r != r else f"{r:g}"),
            "tok/s": frame["tokens_per_s"].map(lambda x: fmt(x, 1)),
            "TPOT p50 (ms)": frame["tpot_p50_ms"].map(lambda x: fmt(x, 1)),
            f"TPOT ≤ {slo.tpot_ms:g} ms" if slo.tpot_ms else "TPOT SLO": frame["meets_tpot_slo"]
            .map({True: "yes", False: "no"})
            .fillna("—"),
            "GPU J/token": frame["gpu_j_per_token"].map(lambda x: fmt(x, 3)),
            "AR GPU J/token": frame["ar_gpu_j_per_token"].map(lambda x: fmt(x, 3)),
            "CPU J/token": frame["cpu_j_per_token"].map(lambda x: fmt(x, 3)),
            "AR CPU J/token": frame["ar_cpu_j_per_token"].map(lambda x: fmt(x, 3)),
            "$/M tokens": frame["usd_per_m_tokens"].map(lambda x: fmt(x, 2)),
            "AR $/M tokens": frame["ar_usd_per_m_tokens"].map(lambda x: fmt(x, 2)),
        }
    )
    sec.tables["deploy_cost_energy"] = (shown, frame)
    lines += [
        "\nPer row (repeats pooled): output tokens/s = Σ tokens / Σ cell span, the span its energy counters cover; "
        "its paired AR's figures beside it. Rows compare at a service level only where both meet the TPOT column.\n",
        markdown_table(shown),
    ]
    return lines


def deploy_section(study: Study, whole: Study | None = None) -> Section:
    """Capacity under the SLO, γ per load (and the engines' own schedules beside it), structured outputs,
    cost and energy (what a deployment decides),
    from ``study``'s cells (the unflagged ones); ``whole`` (every cell) says what was left out."""
    sec = Section("Deployment decisions")
    parts = _capacity(study, sec) + _gamma(study, sec) + _engine_schedules(study, sec)
    parts += _structured(study, sec) + _cost(study, sec)
    sec.markdown = left_out_note(whole, "every decision below") + "\n".join(parts)
    return sec
