"""The precision targets' sequential rule keeps its 95 % interval's coverage (simulated).

Each simulated study draws per-prompt AR and speculative latencies from a realistic distribution of
per-prompt speedups, starts at 5 prompts, adds 5 at a time up to 30 and stops once the runner's rule
(:func:`specstudy.run.precision.target_met`, first look at 10 prompts) says the paired speedup's
interval is within its target.  Its interval must still cover the true ratio of means.

Measured with these seeds (3,000 studies each; 1-12 % of them stopped on the target before the cap):
lognormal spread 0.15 at ±5 % 0.94, lognormal 0.3 at
±10 % 0.94, gamma-skewed 0.94, two modes (30 % of prompts without gain) 0.93.  The limit, shown by the
same simulation and not asserted: with 10 % of prompts at 3× and the rest at 1.3×, the interval
undercovers at a fixed n too (0.68 at 10 prompts, 0.89 at 20): a sample without the rare prompts
cannot see them, and no stopping rule restores that.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from specstudy import intervals
from specstudy.run.precision import target_met

START, STEP, CAP, FIRST_LOOK = 5, 5, 30, 10


def _lognormal(sd):
    def draw(rng, n):
        base = np.exp(rng.normal(0, 0.3, n))
        return base, base / np.exp(rng.normal(math.log(1.5), sd, n))

    return draw


def _gamma(rng, n):
    base = np.exp(rng.normal(0, 0.2, n))
    return base, base / (1 + rng.gamma(1.5, 0.4, n))


def _two_modes(rng, n):
    base = np.exp(rng.normal(0, 0.2, n))
    return base, base / (np.where(rng.random(n) < 0.3, 1.0, 1.8) * np.exp(rng.normal(0, 0.15, n)))


def _truth(draw):
    base, spec = draw(np.random.default_rng(1), 2_000_000)
    return base.sum() / spec.sum()


def _study(rng, draw, target):
    """One study under the rule: (covers, prompts at the stop, stopped on the target)."""
    base, spec = draw(rng, CAP)
    n = START
    while True:
        lo, hi = intervals.ratio_ci(base[:n], spec[:n], min_n=2)
        half = intervals.relative_half_width(base[:n].sum() / spec[:n].sum(), (lo, hi))
        met = target_met(half, n, FIRST_LOOK, target)
        if met or n >= CAP:
            return lo, hi, n, met
        n = min(CAP, n + STEP)


@pytest.mark.parametrize(
    "draw,target",
    [(_lognormal(0.15), 0.05), (_lognormal(0.3), 0.10), (_gamma, 0.08), (_two_modes, 0.08)],
    ids=["lognormal-0.15", "lognormal-0.3", "gamma", "two-modes"],
)
def test_the_sequential_rule_keeps_coverage_near_95_percent(draw, target):
    rng, true = np.random.default_rng(0), _truth(draw)
    runs = [_study(rng, draw, target) for _ in range(3000)]
    coverage = np.mean([lo <= true <= hi for lo, hi, *_ in runs])
    stopped_early = np.mean([met and n < CAP for *_, n, met in runs])
    assert coverage >= 0.92, coverage
    assert stopped_early > 0.0  # the rule did stop some studies on their interval: the check means something


def test_stopping_at_the_first_prompts_without_a_first_look_costs_coverage():
    """The same two-mode prompts stopped as soon as 5 prompts look precise: below the rule's."""
    rng, true = np.random.default_rng(0), _truth(_two_modes)
    early = []
    for _ in range(2000):
        base, spec = _two_modes(rng, CAP)
        n = START
        while True:
            lo, hi = intervals.ratio_ci(base[:n], spec[:n], min_n=2)
            if (
                target_met(intervals.relative_half_width(base[:n].sum() / spec[:n].sum(), (lo, hi)), n, START, 0.10)
                or n >= CAP
            ):
                break
            n += STEP
        early.append(lo <= true <= hi)
    assert np.mean(early) < 0.90
