"""The capacity's interval over repeats, checked by simulating the capacity search with a known truth.

Each simulated repeat is a server whose capacity that day is ``C·exp(σ·z)`` (run-to-run spread); the
search probes the sweep's rates, then bisects the bracket geometrically as ``refine_rates`` does
(:func:`specstudy.analysis.capacity.bracket` finds each repeat's capacity).  The truth is the geometric
mean of the capacities this search finds, from many repeats; the interval over 5 repeats (on the log
scale: a rate is positive) must cover it near 95 % and stay above zero.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from specstudy.analysis import capacity
from specstudy.intervals import MIN_PROMPTS_FOR_CI

RATES = (0.5, 1.0, 2.0, 4.0, 8.0)


def _search(true_cap: float, rounds: int = 3) -> float:
    """One repeat's capacity: the sweep's rates, then ``rounds`` geometric bisections of its bracket."""
    held = {r: r <= true_cap for r in RATES}
    for _ in range(rounds):
        rate = capacity.next_rate(held, step=RATES[1] / RATES[0])
        if rate is None:
            break
        held[rate] = rate <= true_cap
    return capacity.bracket(held)[0]


@pytest.mark.parametrize("mean", [2.7, 0.45])  # 0.45: most repeats break at the grid's lowest rate, which extends
def test_the_interval_over_repeats_covers_the_searched_capacity_near_nominal(mean):
    rng = np.random.default_rng(35)
    true = lambda n: mean * np.exp(0.25 * rng.standard_normal(n))  # noqa: E731
    truth = float(np.exp(np.mean(np.log([_search(c) for c in true(40_000)]))))
    hits, trials = 0, 2_000
    for _ in range(trials):
        _, lo, hi = capacity.repeat_interval([_search(c) for c in true(MIN_PROMPTS_FOR_CI)])
        hits += lo <= truth <= hi
        assert lo > 0
    coverage = hits / trials
    assert 0.92 <= coverage <= 0.975, coverage


def test_too_few_repeats_or_a_search_that_never_broke_give_no_interval():
    mean, lo, hi = capacity.repeat_interval([1.0, 2.0, 2.0])
    assert mean == pytest.approx(4 ** (1 / 3)) and lo != lo and hi != hi
    mean, lo, hi = capacity.repeat_interval([1.0, 2.0, 2.0, 1.0, math.inf])
    assert math.isinf(mean) and lo != lo
    mean, lo, hi = capacity.repeat_interval([1.0, 2.0, 2.0, 1.0, 1.5])
    assert lo < mean < hi


def test_a_slow_machines_capacities_keep_a_positive_interval_where_a_linear_one_reached_below_zero():
    """The issue's slow VM: capacities spread over an order of magnitude near zero.  The t-interval of the
    plain mean reached below 0 req/s; the log-scale interval stays positive and holds the geometric mean."""
    from specstudy.intervals import mean_ci

    caps = [0.05, 0.4, 0.1, 0.3, 0.06]
    assert mean_ci(caps)[1] < 0
    centre, lo, hi = capacity.repeat_interval(caps)
    assert 0 < lo < centre < hi and centre == pytest.approx(float(np.exp(np.mean(np.log(caps)))))
    centre, lo, hi = capacity.repeat_interval([0.0, 0.4, 0.1, 0.3, 0.06])  # one repeat broke at every rate
    assert centre == 0.0 and lo != lo and hi != hi  # below the lowest rate probed: a bound, no interval


def _rounds(
    true_cap: float, service: float, rates: tuple[float, ...], use_served: bool
) -> tuple[int, tuple[float, float]]:
    """Rounds of the search until its bracket is within 1.2x: a probe holds at or below the true capacity,
    and over capacity the machine serves its service rate (what :func:`capacity.served_rate` reads)."""
    held = {r: r <= true_cap for r in rates}
    served = {r: min(r, service) for r in rates}
    for k in range(20):
        lowest = min(held)
        rate = capacity.next_rate(held, rates[1] / rates[0], 1.2, served[lowest] if use_served else math.nan)
        if rate is None:
            return k, capacity.bracket(held)
        held[rate], served[rate] = rate <= true_cap, min(rate, service)
    raise AssertionError("the search did not converge")


@pytest.mark.parametrize("true_cap, service", [(0.16, 0.2), (0.05, 0.07), (0.3, 0.31)])
def test_a_slow_machine_is_bracketed_from_the_rate_it_served_in_fewer_rounds(true_cap, service):
    """cpu-deploy's llama.cpp grid (0.8, 1.25 req/s) on machines 4-16x slower than it was made on: the
    search that steps down from the rate the machine served brackets the same capacity in fewer rounds."""
    grid = (0.8, 1.25)
    old_rounds, old = _rounds(true_cap, service, grid, use_served=False)
    new_rounds, new = _rounds(true_cap, service, grid, use_served=True)
    for cap, broke in (old, new):
        assert cap <= true_cap < broke and broke / cap <= 1.2
    assert new_rounds < old_rounds


def test_the_served_rate_is_requests_completed_over_the_probes_span():
    from specstudy.records import Cell, Request, Sampling

    cell = Cell("s", "cpu", "llamacpp", "ar", "code", "m", id="c")
    recs = [
        cell.new_record(
            Request(f"p{i}", "x"), Sampling(), output_tokens=4, start_epoch=100.0 + i, end_s=3.0, status="ok"
        )
        for i in range(5)
    ]
    assert capacity.served_rate(recs) == pytest.approx(5 / (104.0 + 3.0 - 100.0))
    assert math.isnan(capacity.served_rate(recs[:1]))
