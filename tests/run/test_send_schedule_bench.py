"""bench/send_schedule.py runs end to end on a tiny load (structure only: its timings are for a quiet
machine and are printed, never asserted)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "send_schedule.py"


def _bench():
    spec = importlib.util.spec_from_file_location("send_schedule", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_send_schedule_bench_reports_both_senders_at_both_rates(capsys):
    res = _bench().bench(n=4, rate=50.0, repeats=2, stub_ttft_ms=5)
    rows = res["rows"]
    assert {(r["sender"].split()[0], r["rate"]) for r in rows} == {
        ("kit", "inf"),
        ("kit", 50.0),
        ("thread", "inf"),
        ("thread", 50.0),
    }
    assert len(rows) == 8 and all(r["ok"] == 4 and r["n"] == 4 for r in rows)  # the stub answered every request
    for r in rows:
        assert r["send_spread_ms"] >= 0 and r["arrival_spread_ms"] >= 0 and not math.isnan(r["lag"]["max_ms"])
    s = res["summary"]
    assert set(s["targets"]) == {"inf_send_spread_ms", "poisson_lag_max_ms"}
    for k in ("inf_send_spread_ms", "inf_arrival_spread_ms", "poisson_lag_max_ms"):
        assert "ratio_threads_over_kit" in s[k]
        assert 0 <= s[k]["kit"]["median"] <= s[k]["kit"]["worst"]  # over the repeats
    assert s["kit_ms_per_send"] == pytest.approx(s["inf_send_spread_ms"]["kit"]["median"] / 3)
    assert _bench().main(["--n", "3", "--repeats", "1"]) == 0 and "poisson_lag_max_ms" in capsys.readouterr().out
