"""The report's tables as DataFrames: the seed article's hardware, method, task and framework tables, measured.

Each function returns ``(display, raw)``: ``display`` is what a reader sees (values with their
95 % CI as text), ``raw`` the numbers behind it (one row per display row).  Nothing here writes
a file; :mod:`specstudy.report` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..analysis.claims import Estimate, overlap
from ..analysis.drafts import optimal_measured, pooled_drafts
from ..analysis.memory import memory_groups
from ..analysis.rates import peak_memory
from ..analysis.rows import (
    HardwareRow,
    MethodRow,
    Prediction,
    family_cells,
    hardware_rows,
    headline_max_new,
    method_rows,
    raw_frame,
    sweep_or_all,
)
from ..analysis.stats import NAN, Pooled, isnum, pooled, predicted_for
from ..analysis.study_records import Study
from ..analysis.trees import is_dynamic_tree
from ..config.task import load_task_config, seed_row
from ..config.vocab import METHOD_FAMILIES, TASKS
from ..frameworks import drafts_from
from ..intervals import MIN_PROMPTS_FOR_CI
from . import wording
from .format import TASK_TITLES, apart_text, fmt, fmt_ci, sampling_text, seed_row_name, short_model
from .model_notes import limit_text, note_text
from .precision_stops import stop_text, target_words

Frames = tuple[pd.DataFrame, pd.DataFrame]

#: the mark of a row that pools a flagged cell (validity checks; the report's Validity section says why)
FLAG_MARK = " ⚑"


def _flags(study: Study) -> dict[str, str]:
    return getattr(study, "flags", None) or {}


def flag_mark(study: Study, cells: Sequence[str]) -> str:
    """:data:`FLAG_MARK` when a cell of the row is flagged (its own checks or its baseline's), else ''."""
    return FLAG_MARK if any(c in _flags(study) for c in cells) else ""


def _label(label: str, p: Pooled) -> str:
    """A row's method name, marked where its acceptance was fixed for timing."""
    return f"{label} (synthetic acceptance {p.sample.synthetic})" if p.sample.synthetic else label


def _ms(p: Pooled, name: str) -> str:
    """``mean / p50 / p99`` of a latency in milliseconds."""
    vals = p.latency.of_kind(name)
    return " / ".join(fmt(v * 1e3 if isnum(v) else NAN, 1) for v in vals)


def _quality(p: Pooled, is_ar: bool) -> dict[str, str]:
    """The seed's quality columns: PPL difference under the target, the shift test, greedy exact match."""
    if is_ar:
        return {"PPL Δ (spec − AR)": "—", "log-prob shift p": "—", "Exact match (greedy)": "—"}
    return {
        "PPL Δ (spec − AR)": fmt(p.quality.ppl_diff, 3),
        "log-prob shift p": fmt(p.quality.logprob_p),
        "Exact match (greedy)": fmt(p.quality.exact_match),
    }


def memory_readings(study: Study) -> dict[tuple[str, str], str]:
    """(framework, label) → its memory overhead in words, as the tables' *Memory overhead* cells show it."""
    return {(g.framework, g.label): wording.memory_text(g.overhead, g.noise, g.source) for g in memory_groups(study)}


def precision_target(study: Study, cell_ids: Sequence[str]) -> dict[str, Any] | None:
    """The stopping rule the cells ran under (the first of their sweeps that states one), None: fixed n."""
    rules = {sw.get("name"): sw.get("precision") for sw in study.config.get("sweeps", []) if sw.get("precision")}
    for c in cell_ids:
        for sw in study.meta(c)["sweeps"]:
            if sw in rules:
                return dict(rules[sw])
    return None


def precision_note(p: Pooled, target: dict[str, Any] | None = None, stopped: str | None = None) -> str:
    """The speedup interval's half-width relative to the speedup, and whether the stopping rule met its
    target, or what stopped it (``stopped``: :func:`~specstudy.report.precision_stops.stop_text`)."""
    if p.sample.n_prompts < MIN_PROMPTS_FOR_CI:
        return f"n too small ({p.sample.n_prompts} prompts)"
    if not isnum(p.paired.speedup_precision):
        return "—"
    reached = f"±{100 * p.paired.speedup_precision:.1f} %"
    if target is None:
        return f"{reached} (fixed n)"
    why = stopped or f"cap of {target['max_prompts']} prompts per task"
    return f"{reached} (target {target_words(p.paired.speedup_precision, float(target['rel_half_width']), why)})"


def hardware_table(study: Study, sweep: str | None = "hardware", rows: Sequence[HardwareRow] | None = None) -> Frames:
    """The seed's hardware table at batch 1 (method, target, draft, α, AL, tokens/s, speedup).

    One row per (framework, method label, drafter, γ, sampling), pooled over the sweep's tasks; AR
    rows pool the baseline cells (``rows``: :func:`~specstudy.analysis.rows.hardware_rows`, computed
    here when not given).  :func:`metric_table` gives the rest of the seed's metric table for the
    same rows.
    """
    rows = hardware_rows(study, sweep) if rows is None else rows
    return pd.DataFrame([_hardware_cells(study, r) for r in rows]), raw_frame(rows)


def _draft_name(r: HardwareRow) -> str:
    """What drafts for the row: its drafter, or what a model-free method drafts from."""
    if r.drafter:
        return short_model(r.drafter)
    return drafts_from(r.method) or "—"


Show = Callable[[Study, HardwareRow], Any]


@dataclass(frozen=True)
class Column:
    """A column of the headline table: its title, what a row shows, and what an AR row shows instead
    (None: the same)."""

    title: str
    show: Show
    ar: Any = None


def estimate(of: Callable[[Pooled], tuple[Any, tuple[float, float]]], digits: int = 2, suffix: str = "") -> Show:
    """A measured estimate and its 95 % interval, both from the row's part (``of``: the pair), marked where
    the row's n is too small for an interval."""
    return lambda study, r: fmt_ci(*of(r.pooled), digits, suffix, n=r.pooled.sample.n_prompts)


def _method_cell(study: Study, r: HardwareRow) -> str:
    return ("Baseline (AR)" if r.is_ar else _label(r.label, r.pooled)) + flag_mark(study, r.cells)


def _seed_row_cell(study: Study, r: HardwareRow) -> str:
    return seed_row_name(r.method, is_dynamic_tree(x for c in r.cells for x in study.records.get(c, [])))


#: the headline (hardware) table's columns in order.  A new column: its metric in
#: :mod:`specstudy.metrics`, its field (and interval) in a part of :mod:`specstudy.analysis.row_parts`,
#: and one line here (docs/methodology.md, "Adding a headline column")
HEADLINE_COLUMNS: list[Column] = [
    Column("Method", _method_cell),
    Column("Seed row", _seed_row_cell),
    Column("Framework", lambda study, r: r.framework),
    Column("Precision", lambda study, r: r.precision),
    Column("Target", lambda study, r: short_model(r.model)),
    Column("Draft", lambda study, r: _draft_name(r), ar="—"),
    Column("γ", lambda study, r: r.gamma, ar="—"),
    Column("Sampling", lambda study, r: sampling_text(r.sampling)),
    Column("α", estimate(lambda p: (p.acceptance.alpha, p.acceptance.alpha_ci)), ar="—"),
    Column("AL", estimate(lambda p: (p.acceptance.acceptance_length, p.acceptance.acceptance_length_ci)), ar="—"),
    Column("tokens/s", estimate(lambda p: (p.throughput.tokens_per_s, p.throughput.tokens_per_s_ci), 1)),
    Column("Speedup", estimate(lambda p: (p.paired.speedup, p.paired.speedup_ci), 2, "×"), ar="1.0×"),
    Column(
        "Arms timed apart (median)",
        lambda study, r: apart_text(r.pooled.sample.arms_apart_s, r.pooled.sample.arms_order),
        ar="—",
    ),
    Column(
        "Decode speedup (TPOT ratio)",
        estimate(lambda p: (p.paired.decode_speedup, p.paired.decode_speedup_ci), 2, "×"),
        ar="—",
    ),
    Column("n (prompts)", lambda study, r: r.pooled.sample.n_prompts),
    Column("repeats", lambda study, r: r.pooled.sample.n_repeats, ar="—"),
    Column(
        "Precision reached",
        lambda study, r: precision_note(r.pooled, precision_target(study, r.cells), stop_text(study, r.cells)),
        ar="—",
    ),
]


def _hardware_cells(study: Study, r: HardwareRow) -> dict[str, Any]:
    """One hardware-table row as shown: a value per :data:`HEADLINE_COLUMNS`, estimates with their 95 % CI."""
    return {c.title: c.ar if r.is_ar and c.ar is not None else c.show(study, r) for c in HEADLINE_COLUMNS}


def _prediction(pr: Prediction) -> dict[str, str]:
    """The cost model's speedup for a measured row as shown: prediction, measured/predicted, and what
    the model took from the measurement or which assumption it breaks."""
    return {
        "Speedup (cost model, prediction)": fmt(pr.speedup, 2, "×"),
        "measured/predicted": fmt(pr.ratio),
        "Model note": note_text(pr.bends),
    }


def metric_table(study: Study, sweep: str | None = "hardware") -> pd.DataFrame:
    """The rest of the seed's metric table for the hardware table's rows: latency (mean / p50 / p99),
    tokens per target forward, memory overhead, quality, and the run-to-run spread of the speedup."""

    memory = memory_readings(study)
    rows = []
    for r in hardware_rows(study, sweep, pool=pooled_drafts):
        p, is_ar = r.pooled, r.is_ar
        lo, hi = p.paired.speedup_runs
        rows.append(
            {
                "Method": ("Baseline (AR)" if is_ar else _label(r.label, p)) + flag_mark(study, r.cells),
                "Framework": r.framework,
                "γ": "—" if is_ar else r.gamma,
                "Sampling": sampling_text(r.sampling),
                "tokens/s": fmt(p.throughput.tokens_per_s, 1),
                "TTFT ms (mean / p50 / p99)": _ms(p, "ttft"),
                "TPOT ms (mean / p50 / p99)": _ms(p, "tpot"),
                "E2E ms (mean / p50 / p99)": _ms(p, "e2e"),
                "tokens / target forward": fmt(p.acceptance.tokens_per_forward),
                "Memory overhead": "—" if is_ar else memory.get((r.framework, r.label), "—"),
                **_quality(p, is_ar),
                "Speedup run-to-run (min–max)": "—"
                if is_ar or lo != lo
                else f"{lo:.2f}–{hi:.2f} ({p.sample.n_repeats} runs)",
                **(dict.fromkeys(_prediction(Prediction()), "—") if is_ar else _prediction(Prediction.of(p, r.gamma))),
            }
        )
    return pd.DataFrame(rows)


def method_table(study: Study, family: str, sweep: str | None = "method_family") -> Frames:
    """α, AL, α̂, per-position acceptance, speedup (measured and predicted) per (label, γ, batch, sampling)."""
    rows = method_rows(study, family, sweep)
    return pd.DataFrame([_method_cells(study, r) for r in rows]), _with_notes(raw_frame(rows), rows)


def _with_notes(raw: pd.DataFrame, rows: Sequence[MethodRow]) -> pd.DataFrame:
    """The rows' numbers with each row's model note in words beside its predicted speedup."""
    if rows:
        notes = [note_text(r.prediction.bends) if isnum(r.prediction.speedup) else "" for r in rows]
        raw.insert(int(raw.columns.get_loc("predicted_speedup")) + 1, "model_note", notes)
    return raw


def _method_cells(study: Study, r: MethodRow) -> dict[str, Any]:
    """One method-family row as shown (marked where it pools a flagged cell)."""
    p = r.pooled
    return {
        "Framework": r.framework,
        "Method": _label(r.label, p) + flag_mark(study, r.cells),
        "γ": r.gamma,
        "Batch": r.batch_size,
        "Sampling": sampling_text(r.sampling),
        "α": fmt_ci(p.acceptance.alpha, p.acceptance.alpha_ci, n=p.sample.n_prompts),
        "α̂ (i.i.d.)": fmt(p.acceptance.alpha_hat),
        "AL": fmt_ci(p.acceptance.acceptance_length, p.acceptance.acceptance_length_ci, n=p.sample.n_prompts),
        "AL per request (mean)": fmt(p.acceptance.acceptance_length_per_request),
        "requests never drafted": "—" if p.acceptance.never_drafted is None else p.acceptance.never_drafted,
        "tokens / target forward": fmt(p.acceptance.tokens_per_forward),
        "c (measured)": fmt(p.cost.c, 3),
        "verify cost (×T1)": fmt(p.cost.verify_ratio),
        "tokens/s": fmt_ci(p.throughput.tokens_per_s, p.throughput.tokens_per_s_ci, 1, n=p.sample.n_prompts),
        "Speedup (measured)": fmt_ci(p.paired.speedup, p.paired.speedup_ci, 2, "×", n=p.sample.n_prompts),
        **_prediction(r.prediction),
        "n (prompts)": p.sample.n_prompts,
        "repeats": p.sample.n_repeats,
        "Exact match (greedy)": fmt(p.quality.exact_match),
    }


def batch_sweep_frame(study: Study, family: str, sweep: str | None = "method_family") -> pd.DataFrame:
    """The family's batch sweep beside AR: what a throughput-against-latency (Pareto) plot needs.

    One row per (framework, label, γ, drafter, sampling, batch) of the speculative series measured at
    several batch sizes, and one AR row per (framework, sampling, batch) pooled from those cells' own
    paired baselines, so both series cover the same prompts.  ``tokens_per_s`` is the pooled total
    (Σ tokens / Σ batch wall span at a batch > 1); ``tpot_p50_s`` the median request's time per output
    token, whose inverse is the decode speed one request sees.
    """
    spec: dict[tuple[Any, ...], dict[int, list[str]]] = {}
    for c in family_cells(study, family, sweep):
        m = study.meta(c)
        if m["request_rate"] is not None:  # a request-rate cell belongs to the rate sweep's figure
            continue
        key = (m["framework"], m["method"], m["label"], m["gamma"] or 0, m["drafter"] or "", m["sampling"])
        spec.setdefault(key, {}).setdefault(m["batch_size"], []).append(c)
    spec = {k: v for k, v in spec.items() if len(v) > 1}
    ar: dict[tuple[Any, ...], dict[int, set[str]]] = {}
    for (fw, _, _, _, _, sampling), by_batch in spec.items():
        for batch, cells in by_batch.items():
            base = {b for c in cells if (b := study.meta(c)["baseline_cell_id"]) and b in study.records}
            ar.setdefault((fw, "ar", "AR", 0, "", sampling), {}).setdefault(batch, set()).update(base)
    series = [(k, {b: sorted(v) for b, v in d.items()}) for k, d in sorted(ar.items())] + sorted(spec.items())
    rows = []
    for key, by_batch in series:
        fw, method, label, gamma, drafter, sampling = key
        for batch in sorted(by_batch):
            if not by_batch[batch]:
                continue
            p = pooled(study, by_batch[batch])
            rows.append(
                {
                    "framework": fw,
                    "method": method,
                    "label": label,
                    "gamma": gamma,
                    "drafter": drafter,
                    "sampling": sampling,
                    "batch_size": batch,
                    "tokens_per_s": p.throughput.tokens_per_s,
                    "tokens_per_s_ci": p.throughput.tokens_per_s_ci,
                    "tpot_p50_s": p.latency.tpot_p50_s,
                    "speedup": p.paired.speedup,
                    "n_requests": p.sample.n_requests,
                }
            )
    return pd.DataFrame(rows)


def seed_reference(task: str, study: Study | None = None) -> str:
    """The seed article's row for this task's category, quoted for comparison: from the study's
    task snapshot (``study.json``), else ``params/tasks/<task>.yaml``; a user category has none."""
    info = ((study.plan.get("tasks") or {}) if study is not None else {}).get(task)
    if info is None:
        try:
            cfg = load_task_config(task)
        except (ValueError, OSError):
            return "—"
        info = {"category": cfg.category, "seed_reference": seed_row(cfg)}
    if info.get("category") not in TASKS:
        return "no seed row: a user category"
    ref = dict(info.get("seed_reference") or {})
    if not ref:
        return "—"
    a, g = ref.get("alpha_range"), ref.get("gamma_range")
    parts = [
        str(ref["entropy"]) + " entropy" if ref.get("entropy") else "",
        f"α {a[0]:.2f}–{a[1]:.2f}" if a else "",
        f"γ {g[0]}–{g[1]}" if g else "",
    ]
    return ", ".join(p for p in parts if p) or "—"


def tasks_in(study: Study) -> list[str]:
    ts = {study.meta(c)["task"] for c in study.records}
    return [t for t in TASKS if t in ts] + sorted(ts - set(TASKS))


def families_in(study: Study) -> list[str]:
    fams = {study.meta(c)["family"] for c in study.records} - {"ar"}
    return [f for f in METHOD_FAMILIES if f in fams] + sorted(fams - set(METHOD_FAMILIES))


def _best_gammas(study: Study, spec: list[str]) -> tuple[list[str], list[str]]:
    """Per method (label; framework and sampling where they differ): the measured best γ and the cost
    model's optimum from its measured draft lengths, α̂ and step costs, searched no deeper than
    measured nor than the drafter can draft."""
    best, model_opt = [], []
    by_row: dict[tuple[str, str, str], list[str]] = {}
    for c in spec:
        m = study.meta(c)
        by_row.setdefault((m["label"], m["framework"], m["sampling"]), []).append(c)
    for (label, fw, sampling), cs in sorted(by_row.items()):
        others = [k for k in by_row if k[0] == label]
        name = label + "".join(
            f" ({v})" for i, v in ((1, fw), (2, sampling_text(sampling))) if len({k[i] for k in others}) > 1
        )
        by_g: dict[int, list[str]] = {}
        for c in cs:
            by_g.setdefault(study.meta(c)["gamma"], []).append(c)
        pg = {g: pooled_drafts(study, v) for g, v in by_g.items()}
        ok = {g: p for g, p in pg.items() if isnum(p.paired.speedup)}
        if ok:
            g_best = max(ok, key=lambda g: ok[g].paired.speedup)
            pb = ok[g_best]
            pred = predicted_for(pb, g_best)
            vs = (
                f", predicted {pred:.2f}×, measured/predicted {pb.paired.speedup / pred:.2f}"
                if isnum(pred) and pred > 0
                else ""
            )
            best.append(
                f"{name}: γ={g_best} ({fmt_ci(pb.paired.speedup, pb.paired.speedup_ci, 2, '×', n=pb.sample.n_prompts)}{vs})"
            )
        opt = optimal_measured(study, {g: v for g, v in by_g.items() if g}, per_g=pg)
        if opt is not None:
            why = limit_text(opt["why"], opt["max_gamma"])
            model_opt.append(
                f"{name}: γ={opt['gamma']} ({opt['speedup']:.2f}×, searched γ ≤ {opt['max_gamma']}: {why})"
            )
    return best, model_opt


def task_table(study: Study, tasks: Sequence[str] | None = None, sweep: str | None = "task_category") -> Frames:
    """The seed's task table measured: entropy, α range, optimal γ (measured and cost model)."""
    sweep = sweep_or_all(study, sweep)
    mnt = headline_max_new(study)
    rows, raw = [], []
    for task in tasks or tasks_in(study):
        spec = [
            c for c in study.spec_cell_ids(sweep, task=task, batch_size=1) if study.meta(c)["max_new_tokens"] == mnt
        ]
        base = [
            c
            for c in study.cell_ids(sweep, task=task, batch_size=1, method="ar")
            if study.meta(c)["max_new_tokens"] == mnt
        ]
        if not spec and not base:
            continue
        ent = pooled(study, base or spec)  # entropy of the target along its own (AR) text
        alphas = [p.acceptance.alpha for p in (pooled(study, [c]) for c in spec) if isnum(p.acceptance.alpha)]
        allp = pooled(study, spec) if spec else Pooled()
        best, model_opt = _best_gammas(study, [c for c in spec if c not in _flags(study)])
        left = sum(c in _flags(study) for c in spec)
        rows.append(
            {
                "Task": TASK_TITLES.get(task, task) + flag_mark(study, spec + base),
                "Entropy (nats/token)": fmt_ci(ent.quality.entropy, ent.quality.entropy_ci),
                "α range (per cell)": f"{min(alphas):.2f}–{max(alphas):.2f}" if alphas else "—",
                "α pooled": fmt_ci(allp.acceptance.alpha, allp.acceptance.alpha_ci, n=allp.sample.n_prompts),
                "Best γ measured": ("; ".join(best) or "—")
                + (f" ({left} flagged cell{'s' if left > 1 else ''} left out)" if left else ""),
                "Optimal γ (cost model from measured draft lengths, α̂, c; prediction)": "; ".join(model_opt) or "—",
                "n (prompts)": allp.sample.n_prompts,
                "Seed article (quoted, not measured)": seed_reference(task, study),
            }
        )
        raw.append(
            {
                "task": task,
                "entropy": ent.quality.entropy,
                "entropy_ci": ent.quality.entropy_ci,
                "alpha_min": min(alphas) if alphas else NAN,
                "alpha_max": max(alphas) if alphas else NAN,
                "alpha": allp.acceptance.alpha,
                "alpha_ci": allp.acceptance.alpha_ci,
                "alpha_hat": allp.acceptance.alpha_hat,
                "best_gamma": "; ".join(best),
                "model_optimal_gamma": "; ".join(model_opt),
                "n_prompts": allp.sample.n_prompts,
                "n_pairs": allp.sample.n_pairs,
            }
        )
    return pd.DataFrame(rows), pd.DataFrame(raw)


def framework_table(study: Study) -> pd.DataFrame:
    """The seed's framework table, measured: per framework the methods run and their best numbers."""

    memory = memory_readings(study)
    rows = []
    mnt = headline_max_new(study)
    for fw in sorted({study.meta(c)["framework"] for c in study.records}):
        cells = [c for c in study.cell_ids(None, framework=fw) if study.meta(c)["max_new_tokens"] == mnt]
        spec = [c for c in cells if study.meta(c)["method"] != "ar"]
        fams = sorted({study.meta(c)["method"] for c in cells})
        batches = sorted({study.meta(c)["batch_size"] for c in spec})
        best, best_p, best_label = None, None, ""
        rows_b1: dict[tuple[Any, ...], list[str]] = {}
        for c in spec:
            m = study.meta(c)
            if m["batch_size"] == 1 and not m["synthetic"] and c not in _flags(study):  # best from unflagged rows
                rows_b1.setdefault((m["label"], m["gamma"] or 0, m["sampling"]), []).append(c)
        # among rows with enough prompts for an interval, greedy first (rows of one sampling compared)
        ranked = sorted(
            (
                (sampling != "greedy", -p.paired.speedup, f"{label} γ={gamma} ({sampling_text(sampling)})", p, label)
                for (label, gamma, sampling), cs in rows_b1.items()
                if isnum((p := pooled(study, cs)).paired.speedup) and p.sample.n_prompts >= MIN_PROMPTS_FOR_CI
            ),
            key=lambda t: (t[0], t[1], t[2]),
        )
        ranked = [t for t in ranked if t[0] == ranked[0][0]] if ranked else []
        if ranked:
            best, best_p, best_label = ranked[0][2], ranked[0][3], ranked[0][4]
        runner = ranked[1] if len(ranked) > 1 else None
        base_cells = [c for c in cells if study.meta(c)["method"] == "ar" and study.meta(c)["batch_size"] == 1]
        base = pooled(study, base_cells)
        peak, source = peak_memory([r for c in base_cells for r in study.records[c]])
        precisions = sorted({str(study.meta(c)["precision"]) for c in cells})
        rows.append(
            {
                "Framework": fw + flag_mark(study, cells),
                "Methods measured": ", ".join(fams),
                "Tree verification": "○" if "tree" in fams else "×",
                "Precision": ", ".join(precisions),
                "Batch sizes (speculative)": ", ".join(map(str, batches)) or "—",
                "AR tokens/s (batch 1)": fmt_ci(
                    base.throughput.tokens_per_s, base.throughput.tokens_per_s_ci, 1, n=base.sample.n_prompts
                ),
                "AR TPOT ms (mean / p50 / p99)": _ms(base, "tpot"),
                "Best method (batch 1, ≥ 5 prompts)": (
                    f"{best}, the fastest of {len(ranked)} row{'s' if len(ranked) > 1 else ''}" if best else "—"
                ),
                "Runner-up (intervals)": (
                    f"{runner[2]}: {fmt_ci(runner[3].paired.speedup, runner[3].paired.speedup_ci, 2, '×', n=runner[3].sample.n_prompts)} "
                    f"({_overlap_word(best_p, runner[3])})"
                    if runner and best_p
                    else "—"
                ),
                "Its speedup": fmt_ci(
                    best_p.paired.speedup, best_p.paired.speedup_ci, 2, "×", n=best_p.sample.n_prompts
                )
                if best_p
                else "—",
                "Its tokens/s": fmt_ci(
                    best_p.throughput.tokens_per_s, best_p.throughput.tokens_per_s_ci, 1, n=best_p.sample.n_prompts
                )
                if best_p
                else "—",
                "Its TTFT / TPOT / E2E ms (p50)": (
                    " / ".join(
                        fmt(v * 1e3 if isnum(v) else NAN, 1)
                        for v in (best_p.latency.ttft_p50_s, best_p.latency.tpot_p50_s, best_p.latency.e2e_p50_s)
                    )
                    if best_p
                    else "—"
                ),
                "AR peak memory MB (source)": f"{fmt(peak / 1e6, 0)} ({source})" if isnum(peak) else "—",
                "Its memory overhead": memory.get((fw, best_label), "—") if best_p else "—",
                "n (prompts)": best_p.sample.n_prompts if best_p else 0,
            }
        )
    return pd.DataFrame(rows)


def _overlap_word(a: Pooled, b: Pooled) -> str:
    """Whether two rows' speedup intervals overlap: a best whose interval overlaps the runner-up's is not
    shown to be better."""
    o = overlap(Estimate.of(a), Estimate.of(b))
    return "no interval" if o is None else ("overlap: not resolved" if o else "disjoint")


def telemetry_table(study: Study) -> pd.DataFrame:
    """One row per cell: load, CPU clock, RSS, GPU temperature/clock/power, throttling."""
    rows = []
    for cid, recs in study.records.items():
        e = recs[0].extra if recs else {}
        rows.append(
            {
                "cell": cid,
                "flagged": flag_mark(study, [cid]).strip(),
                "load_1m_mean": e.get("tel_load_1m_mean"),
                "cpu_freq_mean_mhz": e.get("tel_cpu_freq_mean_mhz"),
                "cpu_steal_mean_pct": e.get("tel_cpu_steal_mean_pct"),
                "baseline": study.meta(cid)["baseline_cell_id"] if cid in study.cells else None,
                "rss_peak_gb": (e.get("tel_rss_peak_bytes") or 0) / 1e9 or None,
                "gpu_temp_max_c": e.get("tel_gpu_temp_max_c"),
                "gpu_sm_clock_min_mhz": e.get("tel_gpu_sm_clock_min_mhz"),
                "gpu_power_mean_w": e.get("tel_gpu_power_mean_w"),
                "throttled": bool(e.get("tel_throttled")),
                "reasons": ",".join(e.get("throttle_reasons") or []),
            }
        )
    return pd.DataFrame(rows)
