"""Verdicts on the seed's expectations, decided from intervals, never from point values.

Why: a sentence written by hand ("short outputs leave little decode time to save") can sit above a
table that shows the reverse.  Every effect the report states goes through :func:`verdict`,
:func:`compare` or :func:`resolved`, whose answer is a value (:data:`VERDICTS`);
:mod:`specstudy.report.wording` words it, so the text says what this study observed, the reverse of
it, or that it cannot tell.  Pure: numbers in, verdicts out; the estimates and intervals themselves
are :mod:`specstudy.metrics`'s (via :class:`stats.Pooled`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..intervals import MIN_PROMPTS_FOR_CI
from .stats import Pooled

Direction = Literal["above", "below"]

OBSERVED = "observed"  # the interval excludes the threshold on the side the seed expects
REVERSED = "reversed"  # it excludes the threshold on the other side
CANNOT_TELL = "cannot tell"  # the interval contains the threshold (two rows: their intervals overlap)
N_TOO_SMALL = "n too small"  # no interval (fewer than MIN_PROMPTS_FOR_CI prompts)
VERDICTS = (OBSERVED, REVERSED, CANNOT_TELL, N_TOO_SMALL)

#: a greedy flip where the target's two candidates differ by less than this (nats) is a near-tie
NEAR_TIE_NATS = 0.05


def finite(x: object) -> bool:
    """A real, finite number (bools are not numbers here)."""
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Estimate:
    """An estimate, its 95 % interval and its n (distinct prompts): what a verdict is decided from."""

    value: float
    ci: tuple[float, float]
    n: int

    @classmethod
    def of(cls, row: Any, name: str = "speedup") -> Estimate:
        """``name``, its ``_ci`` and ``n_prompts`` of a :class:`~.stats.Pooled` (read from the part that
        holds them) or of a frame row of one (its flat CSV line)."""
        get = row.value if isinstance(row, Pooled) else lambda k: getattr(row, k)
        value, (lo, hi) = get(name), get(f"{name}_ci")
        return cls(float(value) if finite(value) else math.nan, (float(lo), float(hi)), int(get("n_prompts")))

    @property
    def has_interval(self) -> bool:
        lo, hi = self.ci
        return self.n >= MIN_PROMPTS_FOR_CI and finite(self.value) and finite(lo) and finite(hi)


def side(est: Estimate, threshold: float) -> str:
    """Where the interval lies against ``threshold``: "above", "below", "contains", or n too small."""
    if not est.has_interval:
        return N_TOO_SMALL
    lo, hi = est.ci
    return "above" if lo > threshold else "below" if hi < threshold else "contains"


def verdict(est: Estimate, threshold: float, expect: Direction) -> str:
    """The seed expects the estimate ``expect`` the threshold: observed, reversed, cannot tell or n too small."""
    s = side(est, threshold)
    if s in (N_TOO_SMALL, "contains"):
        return N_TOO_SMALL if s == N_TOO_SMALL else CANNOT_TELL
    return OBSERVED if s == expect else REVERSED


def compare(a: Estimate, b: Estimate, expect: Direction) -> str:
    """The seed expects row ``a`` ``expect`` row ``b``: decided from the two intervals.

    Disjoint intervals decide (observed / reversed); overlapping ones cannot tell.  Overlap is a
    conservative test: two 95 % intervals can overlap while the difference is still real, so
    "cannot tell" here is not "no difference".
    """
    if not (a.has_interval and b.has_interval):
        return N_TOO_SMALL
    if a.ci[0] > b.ci[1]:
        return OBSERVED if expect == "above" else REVERSED
    if a.ci[1] < b.ci[0]:
        return OBSERVED if expect == "below" else REVERSED
    return CANNOT_TELL


def overlap(a: Estimate, b: Estimate) -> bool | None:
    """Whether two rows' intervals overlap (None when either has none)."""
    if not (a.has_interval and b.has_interval):
        return None
    return not (a.ci[0] > b.ci[1] or a.ci[1] < b.ci[0])


def resolved(delta: float, noise: float) -> str:
    """A difference against the measurement's resolution (the seed expects it positive, e.g. memory)."""
    if not (finite(delta) and finite(noise)):
        return N_TOO_SMALL
    if abs(delta) <= noise:
        return CANNOT_TELL
    return OBSERVED if delta > 0 else REVERSED


def memory_verdict(delta: float, noise: float) -> str:
    """:func:`resolved` at the 0.1 MB the report prints: a difference that prints as large as the
    noise ("+50.2 MB" against "±50.2 MB") is a tie, not beyond it."""
    if not (finite(delta) and finite(noise)):
        return N_TOO_SMALL
    return resolved(round(delta / 1e5) * 1e5, round(noise / 1e5) * 1e5)
