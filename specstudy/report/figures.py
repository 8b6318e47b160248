"""The report's figures: each function takes frames and returns a matplotlib ``Figure``; none writes a file.

Colours come from seaborn's colour-blind-safe palette.  Error bars are the 95 % intervals over
prompts held in the raw table frames (:mod:`specstudy.intervals`: a delta-method t-interval of a
ratio of per-prompt sums, on the log or logit scale, or a t-interval of per-prompt means; none below
5 distinct prompts); predictions are drawn as dashed lines with an "x" marker.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..analysis.stats import break_even, isnum
from .format import sampling_text, short_model

PALETTE = "colorblind"


def _sns() -> Any:
    import seaborn as sns

    sns.set_theme(style="whitegrid", palette=PALETTE, context="paper")
    return sns


def _subplots(*args: Any, **kw: Any) -> tuple[Figure, Any]:
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kw)


def _legend(ax: Any, size: int) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=size)


def _err(values: Sequence[float], cis: Sequence[tuple[float, float]], clip: bool = False) -> np.ndarray:
    """Asymmetric error bars [2, n] from (low, high) CIs; NaN where a CI is unknown, so no bar is drawn
    there (a zero-length bar with caps would read as a CI of zero width)."""
    nan = float("nan")

    def lo(v: float, c: tuple[float, float]) -> float:
        return (max(v - c[0], 0) if clip else v - c[0]) if c[0] == c[0] else nan

    def hi(v: float, c: tuple[float, float]) -> float:
        return (max(c[1] - v, 0) if clip else c[1] - v) if c[1] == c[1] else nan

    return np.array([[lo(v, c), hi(v, c)] for v, c in zip(values, cis)]).T


def _row_names(rows: pd.DataFrame) -> list[str]:
    """A bar's name: "AR" or "<label> γ=<γ>", with the target and the drafter where rows would
    otherwise read alike (two targets in a study, two drafters for one label)."""
    names = ["AR" if m == "ar" else f"{lab} γ={g}" for m, lab, g in zip(rows["method"], rows["label"], rows["gamma"])]
    if "model" in rows and rows["model"].nunique() > 1:
        names = [f"{n} ({short_model(t)})" for n, t in zip(names, rows["model"])]
    keys = list(zip(rows["framework"], names))
    if "drafter" in rows and len(set(keys)) < len(keys):
        names = [f"{n}, {short_model(d)}" if d else n for n, d in zip(names, rows["drafter"])]
    return names


def hardware_methods(raw: pd.DataFrame, hardware: str) -> Figure:
    """tokens/s and speedup at batch 1 with their CIs: one bar per hardware-table row, coloured by framework.

    One facet row per sampling and one bar position per (framework, method, target, drafter, γ) inside it,
    so two engines' AR rows, or a method's greedy and T > 0 rows, never share a bar.
    """
    sns = _sns()
    samplings = list(dict.fromkeys(raw["sampling"]))
    frameworks = list(dict.fromkeys(raw["framework"]))
    colour = dict(zip(frameworks, sns.color_palette(PALETTE, max(1, len(frameworks)))))
    facets = [raw[raw["sampling"] == s] for s in samplings]
    heights = [len(f) + 0.6 * (f["framework"].nunique() - 1) + 0.5 for f in facets]
    fig, axes = _subplots(
        len(facets),
        2,
        figsize=(9.5, 1.0 + 0.28 * sum(heights) + 0.45 * len(facets)),
        squeeze=False,
        sharey="row",
        gridspec_kw={"height_ratios": heights},
    )
    nan_ci = (float("nan"), float("nan"))
    for row_axes, sampling, rows in zip(axes, samplings, facets):
        pos, y = [], 0.0
        for prev, fw in zip([None, *rows["framework"]], rows["framework"]):
            y += 1.0 if prev is None or prev == fw else 1.6  # a gap between one framework's bars and the next's
            pos.append(y)
        ar = (rows["method"] == "ar").to_numpy()
        colours = [colour[fw] for fw in rows["framework"]]
        for ax, col, unit in (
            (row_axes[0], "tokens_per_s", "tokens/s"),
            (row_axes[1], "speedup", "speedup over AR (×)"),
        ):
            vals = rows[col].astype(float).to_numpy()
            cis = list(rows[f"{col}_ci"])
            if col == "speedup":  # AR is the reference: 1 by definition, no CI
                vals = np.where(ar, 1.0, vals)
                cis = [nan_ci if a else c for a, c in zip(ar, cis)]
            # clipped: an interval that leaves out the bar's value (AR's speedup, set to 1 above) would
            # give a negative error length, which stops matplotlib
            ax.barh(pos, vals, xerr=_err(list(vals), cis, clip=True), color=colours, capsize=3, height=0.8)
            ax.set_xlabel(unit)
            ax.set_title(f"{sampling_text(sampling)}: {unit.split(' (')[0]}", fontsize=8)
            if col == "speedup":
                ax.axvline(1.0, color="k", lw=0.8, ls="--")
        row_axes[0].set_yticks(pos, _row_names(rows), fontsize=7)
        row_axes[0].invert_yaxis()
    from matplotlib.patches import Patch

    axes[0, 1].legend(
        [Patch(color=colour[fw]) for fw in frameworks],
        frameworks,
        title="framework",
        fontsize=7,
        title_fontsize=7,
        bbox_to_anchor=(1.02, 1),
        loc="upper left",
        borderaxespad=0,
    )
    fig.suptitle(f"{hardware}: methods at batch 1 (95 % CI)")
    return fig


TELEMETRY_UNITS = {
    "gpu_temp_c": "GPU temperature (°C)",
    "gpu_sm_clock_mhz": "SM clock (MHz)",
    "gpu_power_w": "power (W)",
    "load_1m": "load average (1 min)",
    "cpu_freq_mhz": "CPU clock (MHz)",
    "rss_bytes": "process RSS (GB)",
}


def telemetry(samples: pd.DataFrame, hardware: str) -> Figure:
    """Each sampled sensor over the run (minutes since the first sample)."""
    _sns()
    cols = [c for c in TELEMETRY_UNITS if c in samples and samples[c].notna().any()]
    fig, axes = _subplots(len(cols), 1, figsize=(8, 1.6 * len(cols) + 0.5), sharex=True, squeeze=False)
    t0 = samples["epoch"].min()
    for ax, c in zip(axes[:, 0], cols):
        y = samples[c].astype(float) / (1e9 if c == "rss_bytes" else 1)
        ax.plot((samples["epoch"] - t0) / 60, y, ".", ms=2)
        ax.set_ylabel(TELEMETRY_UNITS[c], fontsize=7)
    axes[-1, 0].set_xlabel("time since study start (min)")
    fig.suptitle(f"{hardware}: telemetry over the run")
    return fig


def speedup_vs_gamma(b1: pd.DataFrame) -> Figure:
    """Batch 1: speedup vs γ (measured with CI, prediction dashed), α and AL vs γ, per-position acceptance."""
    sns = _sns()
    fig, axes = _subplots(1, 3, figsize=(11, 3.3))
    pal = sns.color_palette(PALETTE)
    for i, (label, g) in enumerate(b1.groupby("label")):
        g = g.sort_values("gamma")
        col = pal[i % len(pal)]
        axes[0].errorbar(
            g["gamma"],
            g["speedup"],
            yerr=_err(g["speedup"], g["speedup_ci"], clip=True),
            fmt="o-",
            color=col,
            capsize=3,
            label=f"{label} measured",
        )
        axes[0].plot(g["gamma"], g["predicted_speedup"], "x--", color=col, label=f"{label} prediction")
        axes[1].plot(g["gamma"], g["alpha"], "o-", color=col, label=f"{label} α")
        axes[1].plot(g["gamma"], g["acceptance_length"], "s:", color=col, label=f"{label} AL")
        for _, row in g.iterrows():
            pp = row["per_position_conditional"]
            if pp is not None and len(pp):
                axes[2].plot(
                    range(1, len(pp) + 1),
                    pp,
                    "o-",
                    color=col,
                    alpha=0.5 + 0.5 * (row["gamma"] / max(g["gamma"])),
                    label=f"{label} γ={row['gamma']}",
                )
    axes[0].axhline(1.0, color="k", lw=0.8, ls="--")
    axes[0].set(xlabel="speculation length γ (tokens)", ylabel="speedup over AR (×)", title="speedup vs γ (batch 1)")
    axes[1].set(
        xlabel="speculation length γ (tokens)", ylabel="α (ratio) / AL (tokens per draft step)", title="acceptance"
    )
    axes[2].set(
        xlabel="draft position k",
        ylabel="P(k accepted | k reached)",
        title="per-position acceptance (conditional)",
        ylim=(0, 1.02),
    )
    for ax in axes:
        _legend(ax, 6)
    return fig


def al_distribution(hist: dict[tuple[str, int | None], list[int]]) -> Figure:
    """Share of draft steps by tokens emitted (the AL distribution), per (label, γ)."""
    _sns()
    fig, ax = _subplots(figsize=(5, 3))
    maxg = max(max(v) for v in hist.values() if v) if any(hist.values()) else 1
    for (label, g), vals in sorted(hist.items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        if vals:
            ax.hist(
                vals, bins=np.arange(0.5, maxg + 1.5), histtype="step", lw=1.5, density=True, label=f"{label} γ={g}"
            )
    ax.set(
        xlabel="tokens emitted per draft step",
        ylabel="share of draft steps",
        title="acceptance-length distribution (batch 1)",
    )
    _legend(ax, 7)
    return fig


def speedup_vs_batch(multi: pd.DataFrame) -> Figure:
    """Speedup vs batch size per (label, γ), the measured break-even batch marked."""
    _sns()
    fig, ax = _subplots(figsize=(5.5, 3.3))
    for (label, gamma), g in multi.groupby(["label", "gamma"]):
        g = g.sort_values("batch_size")
        line = ax.plot(g["batch_size"], g["speedup"], "o-", label=f"{label} γ={gamma}")[0]
        be = break_even(g["batch_size"].tolist(), g["speedup"].tolist())
        first = g["speedup"].iloc[0]
        if be is not None and not (isnum(first) and first < 1.0):
            ax.axvline(be, color=line.get_color(), ls=":", lw=1)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    ax.set(xlabel="batch size (requests)", ylabel="speedup over AR (×)", title="speedup vs batch size")
    ax.legend(fontsize=7)
    return fig


def alpha_vs_entropy(points: pd.DataFrame, by_task: bool) -> Figure:
    """One point per request: α against the target's entropy along the paired AR output."""
    sns = _sns()
    fig, ax = _subplots(figsize=(7.5, 3.6))
    sns.scatterplot(
        data=points,
        x="entropy",
        y="alpha",
        hue="task" if by_task else "label",
        style="label" if by_task else None,
        ax=ax,
        s=25,
        palette=PALETTE,
    )
    ax.set(
        xlabel="target entropy along the output (nats/token)",
        ylabel="acceptance rate α (accepted/drafted)",
        ylim=(-0.02, 1.02),
        title="acceptance vs entropy (one point per request)",
    )
    ax.legend(fontsize=6, bbox_to_anchor=(1.02, 1), loc="upper left", borderaxespad=0)
    return fig


def speedup_vs_alpha(per_cell: pd.DataFrame) -> Figure:
    """One point per speculative cell at batch 1: speedup against α, the α = 0.4 line of FAQ Q4 marked."""
    sns = _sns()
    fig, ax = _subplots(figsize=(7.5, 3.4))
    sns.scatterplot(data=per_cell, x="alpha", y="speedup", hue="label", style="task", ax=ax, s=30, palette=PALETTE)
    ax.axhline(1.0, color="k", lw=0.8, ls="--")
    ax.axvline(0.4, color="grey", lw=0.8, ls=":")
    ax.set(
        xlabel="acceptance rate α (accepted/drafted)",
        ylabel="speedup over AR (×)",
        title="speedup vs α, one point per cell (batch 1)",
    )
    ax.legend(fontsize=6, bbox_to_anchor=(1.02, 1), loc="upper left", borderaxespad=0)
    return fig


def verification_cost_curve(curves: pd.DataFrame) -> Figure:
    """T(k)/T(1) against k per engine measurement, beside the flat line speculation assumes."""
    sns = _sns()
    fig, ax = _subplots(figsize=(4.6, 3.2))
    pal = sns.color_palette(PALETTE)
    for i, (model, g) in enumerate(curves.groupby("model")):
        g = g.sort_values("k")
        ax.plot(g["k"], g["verify_ratio"], "o-", color=pal[i % len(pal)], label=f"{model} (measured)")
    if len(curves):
        ks = sorted(curves["k"].unique())
        ax.plot(ks, [1.0] * len(ks), "k--", lw=0.8, label="flat: bandwidth-bound (cost model's GPU regime)")
        ax.plot(ks, ks, ":", color="grey", lw=0.8, label="linear: k decode steps")
    ax.set(xlabel="tokens verified in one forward k", ylabel="T(k) / T(1)", title="verification cost")
    _legend(ax, 6)
    fig.tight_layout()
    return fig


def throughput_latency(raw: pd.DataFrame) -> Figure:
    """The request-rate sweep (FAQ Q2): TPOT p50 against output throughput, one line per framework
    and method, each point an offered rate; beside it the engine's mean running batch per rate."""
    sns = _sns()
    fig, axes = _subplots(1, 2, figsize=(10, 3.6))
    groups = list(raw.groupby(["framework", "label", "gamma", "task", "prefix_cache"], dropna=False))
    pal = sns.color_palette(PALETTE, max(1, len(groups)))
    tasks, caches = raw["task"].nunique() > 1, raw["prefix_cache"].nunique(dropna=False) > 1
    for i, ((fw, label, gamma, task, cache), g) in enumerate(groups):
        g = g.sort_values("rate")
        name = f"{fw}: {label}" + (f" γ={gamma:g}" if gamma == gamma and gamma else "")
        name += (f", {task}" if tasks else "") + (f", prefix cache {'on' if cache else 'off'}" if caches else "")
        axes[0].plot(g["output_throughput_tps"], 1e3 * g["tpot_p50_s"], "o-", color=pal[i], label=name)
        for x, y, r in zip(g["output_throughput_tps"], 1e3 * g["tpot_p50_s"], g["rate"]):
            axes[0].annotate(
                "inf" if np.isinf(r) else f"{r:g}", (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points"
            )
        finite = g["rate"].replace(np.inf, np.nan)
        top = 2 * finite.max() if finite.notna().any() else 1.0
        axes[1].plot(g["rate"].replace(np.inf, top), g["mean_running"], "o-", color=pal[i], label=name)
    axes[0].set(
        xlabel="output tokens/s (achieved)",
        ylabel="TPOT p50 (ms)",
        title="throughput vs latency (labels: req/s offered)",
    )
    axes[1].set(
        xlabel="offered request rate (req/s; inf drawn at 2× the highest)", ylabel="mean running batch (engine gauge)"
    )
    _legend(axes[0], 6)
    fig.tight_layout()
    return fig


def _frontier(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points no other point beats on both axes (higher is better on each), by x."""
    order = np.lexsort((-y, -x))
    keep, best = [], -np.inf
    for i in order:
        if y[i] > best:
            keep.append(i)
            best = y[i]
    return np.array(sorted(keep, key=lambda i: x[i]), dtype=int)


def _pareto(
    frame: pd.DataFrame,
    total: str,
    point: str,
    series: Sequence[str],
    point_text: Any,
    what: str,
    slo_tpot_s: float | None = None,
) -> Figure:
    """Per-request tokens/s (1 / TPOT p50) against total tokens/s, one facet per framework, one line per
    series (AR drawn in black), each point labelled by its sweep value; the frontier over all points dashed;
    with ``slo_tpot_s`` the SLO's TPOT limit as a vertical line (points left of it are too slow per request)."""
    sns = _sns()
    df = frame.assign(_per_request=1.0 / frame["tpot_p50_s"].astype(float), _total=frame[total].astype(float))
    df = df[np.isfinite(df["_per_request"]) & np.isfinite(df["_total"])]
    frameworks = list(dict.fromkeys(df["framework"])) or [""]
    fig, axes = _subplots(1, len(frameworks), figsize=(5.2 * len(frameworks), 4.2), squeeze=False)
    pal = sns.color_palette(PALETTE)
    varies = [c for c in series if c in df and df[c].nunique(dropna=False) > 1]
    for ax, fw in zip(axes[0], frameworks):
        g_fw = df[df["framework"] == fw]
        spec_i = 0
        for key, g in g_fw.groupby(["method", "label", "gamma", *varies], dropna=False, sort=False):
            method, label, gamma, *rest = key
            g = g.sort_values(point)
            is_ar = method == "ar"
            name = "AR" if is_ar else f"{label}" + (f" γ={gamma:g}" if gamma == gamma and gamma else "")
            name += "".join(f", {c} {sampling_text(v) if c == 'sampling' else v}" for c, v in zip(varies, rest))
            colour = "k" if is_ar else pal[spec_i % len(pal)]
            spec_i += 0 if is_ar else 1
            ax.plot(g["_per_request"], g["_total"], "s-" if is_ar else "o-", color=colour, label=name, ms=4)
            for x, y, v in zip(g["_per_request"], g["_total"], g[point]):
                ax.annotate(point_text(v), (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
        if len(g_fw) > 1:
            f = _frontier(g_fw["_per_request"].to_numpy(), g_fw["_total"].to_numpy())
            ax.plot(
                g_fw["_per_request"].to_numpy()[f],
                g_fw["_total"].to_numpy()[f],
                "--",
                color="grey",
                lw=0.8,
                zorder=0,
                label="Pareto frontier (all points)",
            )
        if slo_tpot_s:
            ax.axvline(1.0 / slo_tpot_s, color="crimson", ls=":", lw=1.0, label=f"SLO TPOT ≤ {slo_tpot_s * 1e3:g} ms")
        ax.set(
            xlabel="per-request tokens/s (1 / TPOT p50)",
            ylabel="total output tokens/s",
            title=f"{fw}: throughput vs per-request speed (labels: {what})",
        )
        ax.title.set_fontsize(8)
        ax.margins(0.1)  # room for the point labels at the edges
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    return fig


def batch_pareto(sweep: pd.DataFrame) -> Figure:
    """The batch sweep as vLLM's sweep plots show one: total tokens/s against per-request tokens/s,
    AR beside each speculative method, one point per batch size (``tables.batch_sweep_frame``)."""
    return _pareto(sweep, "tokens_per_s", "batch_size", ["drafter", "sampling"], lambda b: f"b={b:g}", "batch size")


def rate_pareto(raw: pd.DataFrame, slo_tpot_s: float | None = None) -> Figure:
    """The request-rate sweep the same way: one point per offered rate (``rates.rate_frame``), the SLO's
    TPOT limit marked."""
    return _pareto(
        raw,
        "output_throughput_tps",
        "rate",
        ["task", "prefix_cache"],
        lambda r: "inf" if np.isinf(r) else f"{r:g}/s",
        "req/s offered",
        slo_tpot_s,
    )
