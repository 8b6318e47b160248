"""CPU steal in the conditions lines: a cell measured at a steal far from its AR baseline's is named,
since on a VM the pair then compares two machine speeds (the same cells ran 5x slower at 30 % steal)."""

from __future__ import annotations

import pandas as pd

from specstudy.report.conditions import STEAL_GAP_PTS, steal_lines
from specstudy.telemetry import Telemetry, _host_sample


def _table(steals: dict[str, float | None], baselines: dict[str, str | None]) -> pd.DataFrame:
    return pd.DataFrame(
        {"cell": list(steals), "cpu_steal_mean_pct": list(steals.values()), "baseline": [baselines[c] for c in steals]}
    )


def test_a_pair_at_different_steal_is_named_and_a_steady_one_is_not():
    t = _table(
        {"ar": 30.0, "ngram": 5.0, "ar2": 8.0, "tree": 8.0 + STEAL_GAP_PTS - 1},
        {"ar": None, "ngram": "ar", "ar2": None, "tree": "ar2"},
    )
    lines = steal_lines(t)
    assert lines[0].startswith("- CPU steal") and "max 30.0 %" in lines[0]
    assert len(lines) == 2 and "1 cell(s)" in lines[1] and "ngram 5 % vs its AR baseline's 30 %" in lines[1]
    assert "tree" not in lines[1]


def test_no_steal_measured_says_nothing():
    assert steal_lines(_table({"ar": None, "x": None}, {"ar": None, "x": "ar"})) == []


def test_the_host_sample_and_the_summary_carry_steal():
    import psutil

    sample = _host_sample(psutil.Process())
    assert "cpu_steal_pct" in sample  # None where the OS reports no steal (not Linux)
    tel = Telemetry(0.5, samples=[{"t_s": 0.0, "cpu_steal_pct": 10.0}, {"t_s": 0.5, "cpu_steal_pct": 30.0}])
    s = tel.summary()
    assert s["cpu_steal_mean_pct"] == 20.0 and s["cpu_steal_max_pct"] == 30.0
