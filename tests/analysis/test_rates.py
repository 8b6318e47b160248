"""The serving frames: the send lag, where speculation stops paying, what the tables show."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from specstudy.analysis import rates
from specstudy.config.schema import Slo
from specstudy.records import RequestRecord
from specstudy.report import figures, rate_tables


def _rec(sched, sent):
    r = RequestRecord("s", "cpu", "vllm-server", "ar", "code", "p", 0, "c", "m")
    r.scheduled_send_s, r.sent_s = sched, sent
    return r


def test_send_lag_is_actual_minus_scheduled_over_requests_that_went_out():
    lag = rates.send_lag([_rec(0.0, 0.001), _rec(0.5, 0.502), _rec(1.0, 1.004), _rec(None, None)])
    assert lag["n"] == 3 and lag["p50_ms"] == pytest.approx(2.0) and lag["max_ms"] == pytest.approx(4.0)
    assert math.isnan(rates.send_lag([_rec(None, None)])["p50_ms"])  # offline rows: unknown, not 0


def _raw():
    rows = []
    for fw, sp in (
        ("vllm-server", {0.5: 1.3, 2.0: 1.1, 4.0: 0.9, math.inf: 0.8}),
        ("llamacpp", {0.5: 1.5, math.inf: 1.2}),
    ):
        for rate, s in sp.items():
            for method, label, gamma, speed in (
                ("ar", "Baseline (AR)", float("nan"), float("nan")),
                ("ngram", "PL", 4.0, s),
            ):
                rows.append(
                    dict(
                        cell_id=f"{fw}{rate}{method}",
                        framework=fw,
                        label=label,
                        method=method,
                        gamma=gamma,
                        prefix_cache=False,
                        task="code",
                        rate=rate,
                        n=8,
                        ok=8,
                        request_throughput_rps=min(rate, 3.0),
                        output_throughput_tps=30.0,
                        ttft_p50_s=0.1,
                        ttft_p99_s=0.2,
                        tpot_p50_s=0.04,
                        tpot_p99_s=0.06,
                        goodput_rps=1.0,
                        mean_running=min(rate, 8.0),
                        mean_waiting=0.0,
                        send_lag_p50_ms=0.2,
                        send_lag_max_ms=0.9,
                        speedup=speed,
                        peak_memory_bytes=4.5e9,
                        memory_source="server_rss",
                    )
                )
    return pd.DataFrame(rows)


def test_stops_paying_names_the_lowest_losing_rate_or_says_it_does_not():
    stop = rate_tables.stops_paying_table(_raw()).set_index("Framework")
    assert stop.loc["vllm-server", "Stops paying at (req/s)"] == "4"
    assert stop.loc["llamacpp", "Stops paying at (req/s)"].startswith("does not")
    assert "inf: 0.80×" in stop.loc["vllm-server", "Speedup per rate"]


def test_a_flagged_rate_cell_is_marked_and_left_out_of_where_speculation_stops_paying():
    """The issue's busy-machine rates: a flagged 4 req/s cell (0.9x) no longer decides the verdict."""
    raw = _raw()
    raw["flagged"] = [
        "busy machine" if (f, r, m) == ("vllm-server", 4.0, "ngram") else ""
        for f, r, m in zip(raw["framework"], raw["rate"], raw["method"])
    ]
    stop = rate_tables.stops_paying_table(raw).set_index("Framework")
    assert stop.loc["vllm-server", "Stops paying at (req/s)"] == "inf"  # 4 req/s was the flagged one
    assert (
        stop.loc["vllm-server", "Flagged rates left out"] == "4"
        and stop.loc["llamacpp", "Flagged rates left out"] == "—"
    )
    methods = rate_tables.rate_table(raw)["Method"]
    assert sum(m.endswith(" ⚑") for m in methods) == 1 and "PL γ=4 ⚑" in set(methods)


def test_rate_table_rows_and_the_curve_figure():
    raw = _raw()
    table = rate_tables.rate_table(raw)
    assert len(table) == len(raw) and set(table["Rate (req/s)"]) == {"0.5", "2", "4", "inf"}
    assert table.loc[0, "TPOT p50 / p99 ms"] == "40.0 / 60.0" and table.loc[0, "Peak memory MB"] == "4500"
    fig = figures.throughput_latency(raw)
    assert len(fig.axes) == 2 and len(fig.axes[0].lines) == 4  # one line per framework x method


def test_rate_pareto_one_facet_per_framework_points_labelled_by_rate():
    raw = _raw()
    raw["output_throughput_tps"] = [10.0 * (i + 1) for i in range(len(raw))]
    raw["tpot_p50_s"] = [0.02 * (i + 1) for i in range(len(raw))]
    fig = figures.rate_pareto(raw)
    assert [ax.get_title().split(":")[0] for ax in fig.axes] == ["vllm-server", "llamacpp"]
    for ax, fw in zip(fig.axes, ("vllm-server", "llamacpp")):
        mine = raw[raw["framework"] == fw]
        lines = {l.get_label(): l for l in ax.get_lines()}
        assert {"AR", "PL γ=4"} <= set(lines)  # AR beside the speculative method
        pl = mine[mine["method"] == "ngram"].sort_values("rate")
        assert list(lines["PL γ=4"].get_xdata()) == pytest.approx(list(1 / pl["tpot_p50_s"]))
        assert list(lines["PL γ=4"].get_ydata()) == pytest.approx(list(pl["output_throughput_tps"]))
        texts = sorted(t.get_text() for t in ax.texts)
        assert texts == sorted(["inf" if math.isinf(r) else f"{r:g}/s" for r in mine["rate"]])
        assert ax.get_legend() is not None


def test_goodput_counts_against_the_slo_the_study_states():
    stated = SimpleNamespace(config={"slo": {"ttft_ms": 800, "tpot_ms": 200, "e2e_ms": None}})
    assert rates.study_slo(stated) == Slo(ttft_ms=800, tpot_ms=200)
    assert rates.study_slo(stated).describe() == "TTFT ≤ 800 ms and TPOT ≤ 200 ms"
    assert rates.study_slo(SimpleNamespace(config={})) == rates.DEFAULT_SLO  # a study run before `slo` existed
    assert rates.DEFAULT_SLO.describe() == "TPOT ≤ 50 ms"


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({}, "meeting TPOT ≤ 50 ms (the seed's FAQ Q1 figure"),
        ({"slo": {"ttft_ms": None, "tpot_ms": 250, "e2e_ms": None}}, "meeting TPOT ≤ 250 ms (the study's `slo`"),
    ],
)
def test_the_serving_section_says_which_slo_goodput_counted_against(monkeypatch, config, says):
    from specstudy.report import sections

    seen = []

    def frame(study, slo=None):
        seen.append(rates.study_slo(study) if slo is None else slo)
        return _raw()

    monkeypatch.setattr(rates, "rate_frame", frame)
    monkeypatch.setattr(rates, "prefix_cache_frame", lambda study: pd.DataFrame())
    sec = sections.serving_section(SimpleNamespace(config=config))
    assert says in sec.markdown and "serving_rates" in sec.tables
    assert seen == [rates.study_slo(SimpleNamespace(config=config))]


def test_rate_pareto_marks_the_slo_tpot_limit():
    raw = _raw()
    raw["tpot_p50_s"] = 0.04
    plain = figures.rate_pareto(raw)
    marked = figures.rate_pareto(raw, slo_tpot_s=0.05)
    for ax in marked.axes:
        slo = [l for l in ax.get_lines() if l.get_label() == "SLO TPOT ≤ 50 ms"]
        assert len(slo) == 1 and list(slo[0].get_xdata()) == pytest.approx([20.0, 20.0])
    assert not any(l.get_label().startswith("SLO") for ax in plain.axes for l in ax.get_lines())


def test_repeats_at_the_same_rate_are_listed_in_rate_order():
    """make study-deploy's capacity probes repeat a rate: sorting (rate, dict) pairs raised TypeError there."""
    raw = pd.concat(
        [_raw(), _raw().assign(cell_id=lambda d: d["cell_id"] + "_r1", speedup=lambda d: d["speedup"] * 0.9)]
    )
    stop = rate_tables.stops_paying_table(raw).set_index("Framework")
    listed = stop.loc["vllm-server", "Speedup per rate"].split(", ")
    rates = [x.split(":")[0] for x in listed]
    assert len(listed) == 2 * len(set(rates)) and rates == sorted(rates, key=lambda r: float(r))
