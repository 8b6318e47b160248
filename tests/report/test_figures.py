"""The report's figures read as their tables do: one bar per hardware-table row (no two engines' or two
samplings' rows drawn over each other), and sweeps as throughput against per-request speed (Pareto)."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pandas as pd
import pytest

from specstudy.analysis.study_records import load
from specstudy.report import figures, tables

NAN_CI = (math.nan, math.nan)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def _hardware_raw() -> pd.DataFrame:
    """Two frameworks x two samplings x the same two labels: 8 rows of the hardware table's raw frame."""
    rows = []
    for i, fw in enumerate(("llamacpp", "reference")):
        for j, sampling in enumerate(("greedy", "T0.7")):  # sampling keys (analysis.study.sampling_key)
            for method, label, gamma in (("ar", "ar", 0), ("ngram", "Prompt lookup", 3)):
                tps = 20.0 + 5 * i + 2 * j + (3 if method == "ngram" else 0)
                sp = math.nan if method == "ar" else 1.2 + 0.1 * i + 0.05 * j
                rows.append(
                    dict(
                        framework=fw,
                        method=method,
                        label=label,
                        model="smollm2-135m",
                        drafter="",
                        gamma=gamma,
                        sampling=sampling,
                        tokens_per_s=tps,
                        tokens_per_s_ci=(tps - 1.0, tps + 1.0),
                        speedup=sp,
                        speedup_ci=NAN_CI if method == "ar" else (sp - 0.1, sp + 0.1),
                    )
                )
    return pd.DataFrame(rows)


def _bars(ax) -> list:
    return [p for p in ax.patches if isinstance(p, matplotlib.patches.Rectangle)]


def _drawn(errorbar) -> int:
    """How many error bars an errorbar container draws (an unknown CI leaves an empty segment)."""
    return sum(len(seg) > 0 and bool(np.isfinite(seg).all()) for seg in errorbar.lines[2][0].get_segments())


def test_hardware_methods_draws_one_bar_per_framework_sampling_and_label():
    raw = _hardware_raw()
    fig = figures.hardware_methods(raw, "cpu")
    axes = fig.axes
    assert len(axes) == 4  # one facet row per sampling, tokens/s and speedup side by side
    titles = [ax.get_title() for ax in axes]
    assert titles == ["greedy: tokens/s", "greedy: speedup over AR", "T=0.7: tokens/s", "T=0.7: speedup over AR"]
    for ax in axes:
        bars = _bars(ax)
        centres = [b.get_y() + b.get_height() / 2 for b in bars]
        assert len(bars) == 4 and len(set(centres)) == 4  # 2 frameworks x (AR, Prompt lookup), none overlapping
        spans = sorted((b.get_y(), b.get_y() + b.get_height()) for b in bars)
        assert all(hi <= nxt_lo for (_, hi), (nxt_lo, _) in zip(spans, spans[1:])), "bars overlap"
        # each framework has its own colour, so its AR bar is told apart from the other engine's
        colours = {tuple(b.get_facecolor()) for b in bars}
        assert len(colours) == 2
    widths = [b.get_width() for b in _bars(axes[0])]
    facet = raw[raw["sampling"] == "greedy"]
    assert widths == pytest.approx(list(facet["tokens_per_s"]))  # bars in the table's row order
    speedups = [b.get_width() for b in _bars(axes[1])]
    assert speedups == pytest.approx([1.0 if m == "ar" else s for m, s in zip(facet["method"], facet["speedup"])])
    assert [t.get_text() for t in axes[0].get_yticklabels()] == ["AR", "Prompt lookup γ=3"] * 2
    legend = axes[1].get_legend()
    assert legend is not None and [t.get_text() for t in legend.get_texts()] == ["llamacpp", "reference"]
    # error bars from each row's CI: drawn for the 4 rows with one on the tokens/s side, not for AR's speedup
    tps_err = [c for c in axes[0].containers if getattr(c, "errorbar", None) is not None][0].errorbar
    sp_err = [c for c in axes[1].containers if getattr(c, "errorbar", None) is not None][0].errorbar
    assert _drawn(tps_err) == 4 and _drawn(sp_err) == 2


def test_hardware_methods_names_the_drafter_where_two_rows_would_read_alike():
    raw = _hardware_raw()
    raw = raw[(raw["framework"] == "reference") & (raw["sampling"] == "greedy")]
    twin = raw[raw["method"] == "ngram"].assign(drafter="other", tokens_per_s=99.0)  # outside its CI: clipped
    fig = figures.hardware_methods(pd.concat([raw, twin], ignore_index=True), "cpu")
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert len(_bars(fig.axes[0])) == 3 and len(set(labels)) == 3 and "Prompt lookup γ=3, other" in labels


def _sweep() -> pd.DataFrame:
    """A batch sweep frame as ``tables.batch_sweep_frame`` returns it: AR and one method at b = 1, 2, 4."""
    rows = []
    for method, label, gamma, tps, tpot in (
        ("ar", "AR", 0, (10.0, 18.0, 30.0), (0.10, 0.11, 0.13)),
        ("ngram", "Prompt lookup", 2, (14.0, 22.0, 28.0), (0.07, 0.09, 0.14)),
    ):
        for b, t, p in zip((1, 2, 4), tps, tpot):
            rows.append(
                dict(
                    framework="reference",
                    method=method,
                    label=label,
                    gamma=gamma,
                    drafter="",
                    sampling="greedy",
                    batch_size=b,
                    tokens_per_s=t,
                    tokens_per_s_ci=NAN_CI,
                    tpot_p50_s=p,
                    speedup=math.nan,
                    n_requests=6,
                )
            )
    return pd.DataFrame(rows)


def test_batch_pareto_plots_total_against_per_request_tokens_per_s_one_line_per_method():
    fig = figures.batch_pareto(_sweep())
    (ax,) = fig.axes
    lines = {l.get_label(): l for l in ax.get_lines()}
    assert set(lines) == {"AR", "Prompt lookup γ=2", "Pareto frontier (all points)"}
    ar = lines["AR"]
    assert list(ar.get_xdata()) == pytest.approx([10.0, 1 / 0.11, 1 / 0.13])  # x: 1 / TPOT p50
    assert list(ar.get_ydata()) == pytest.approx([10.0, 18.0, 30.0])  # y: total tokens/s
    assert sorted(t.get_text() for t in ax.texts) == sorted(["b=1", "b=2", "b=4"] * 2)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["AR", "Prompt lookup γ=2", "Pareto frontier (all points)"]
    # the frontier: AR b=4 (most in total), Prompt lookup b=2 and b=1 (fastest per request); the rest are beaten
    front = lines["Pareto frontier (all points)"]
    assert list(front.get_ydata()) == pytest.approx([30.0, 22.0, 14.0])


def test_frontier_keeps_the_points_nothing_beats_on_both_axes():
    x = np.array([1.0, 2.0, 3.0, 2.5, 0.5])
    y = np.array([5.0, 4.0, 1.0, 0.5, 4.5])
    assert list(figures._frontier(x, y)) == [0, 1, 2]  # (2.5, 0.5) and (0.5, 4.5) are beaten


def test_batch_sweep_frame_pools_ar_from_the_paired_baselines(report_study):
    study = load(report_study)
    sweep = tables.batch_sweep_frame(study, "ngram")
    assert set(sweep["method"]) == {"ar", "ngram"}
    for method in ("ar", "ngram"):
        assert sorted(sweep.loc[sweep["method"] == method, "batch_size"]) == [1, 2]
    assert (sweep["tokens_per_s"] > 0).all() and (sweep["tpot_p50_s"] > 0).all()
    # layer skip runs at batch 1 only (max_batch_size: 1): no sweep, so no Pareto figure for it
    assert tables.batch_sweep_frame(study, "layer_skip").empty
    fig = figures.batch_pareto(sweep)
    assert {l.get_label() for l in fig.axes[0].get_lines()} >= {"AR", "Prompt lookup γ=2"}


def test_speedup_vs_batch_leaves_out_rows_without_a_speedup(report_study, monkeypatch):
    """A row measured at several batch sizes whose baselines are all missing (a rehearsal's heads rows)
    has no speedup: it is not drawn, and the other rows' figure still lays out on its log axis."""
    import io

    from specstudy.report import sections

    study = load(report_study)
    family = tables.families_in(study)[0]
    table, raw = tables.method_table(study, family)
    first = raw.iloc[:1]
    lost = pd.concat([first.assign(batch_size=b, speedup=np.nan, label="no baseline") for b in (1, 4)])
    kept = pd.concat([first.assign(batch_size=b, speedup=s) for b, s in ((1, 1.4), (4, 1.1))])
    monkeypatch.setattr(tables, "method_table", lambda s, f: (table, pd.concat([raw, lost, kept])))
    sec = sections.method_family_section(study, family)
    fig = sec.figures[f"method_{family}_batch"]
    fig.savefig(io.BytesIO(), format="png")  # all-missing rows failed here: nothing on the log axis
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == [
        f"{first['label'].iloc[0]} γ={first['gamma'].iloc[0]}"
    ]
