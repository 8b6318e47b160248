"""The one definition of an interval: the prompt is the unit.

Every interval of the kit (α, AL, speedups, throughput, latency means, capacity over repeats) is
:func:`ratio_ci` over per-prompt sums or :func:`mean_ci` over one value per unit; the simulations in
``tests/test_intervals.py`` check their coverage.  The metrics they are intervals of are defined in
:mod:`specstudy.metrics`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

NAN = float("nan")

#: one float per unit
FloatArray = npt.NDArray[np.float64]


#: fewest distinct prompts for which an interval is printed; below it a table says "n too small".
#: The log-ratio t-interval covered 0.934 at n = 5 and 0.938 at n = 10 in the simulations of
#: tests/test_intervals.py (the percentile bootstrap it replaced covered 0.82 at n = 5); the logit
#: form for a bounded ratio (α) 0.938-0.948 at n = 5 over four acceptance distributions.
MIN_PROMPTS_FOR_CI = 5


def _t_quantile(level: float, df: int) -> float:
    """Student's t quantile of a two-sided ``level`` (scipy, imported here: bench/gpu_check.py runs the
    metrics on a lent GPU machine with only torch, transformers, pandas and nvidia-ml-py)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level={level!r}: must lie in (0, 1)")
    from scipy import stats as scipy_stats

    return float(scipy_stats.t.ppf((1.0 + level) / 2.0, df))


def ratio_ci(
    numerators: Sequence[float] | FloatArray,
    denominators: Sequence[float] | FloatArray,
    level: float = 0.95,
    min_n: int = MIN_PROMPTS_FOR_CI,
    upper: float | None = None,
) -> tuple[float, float]:
    """CI of Σ num / Σ den over independent units (one pair per prompt, repeats already averaged).

    The delta method with a t quantile on n − 1 degrees of freedom, the pairs resampled together by
    construction (each unit contributes through num_i − r·den_i): on the log of the ratio for a
    positive ratio (a speedup, tokens/s), on the logit of r / ``upper`` for a ratio known to lie in
    [0, ``upper``] (α in [0, 1]; accepted per draft step in [0, γ]), so the interval stays inside
    its range; on the ratio scale, clipped, where the transform is undefined (r = 0 or r = upper).
    (NaN, NaN) below ``min_n`` units, where no method holds.  A unit whose denominator is 0 (a prompt
    that drafted nothing, for α or AL) says nothing about the ratio and is not counted: with it counted,
    5 prompts of which one drafted gave a zero-width "interval", and simulated 95 % intervals over 8
    prompts of which 60 % drafted nothing covered 75 % (``tests/test_intervals.py``).
    """
    num, den = np.asarray(numerators, float), np.asarray(denominators, float)
    if num.shape != den.shape:
        raise ValueError(f"paired samples differ in length: {num.shape} vs {den.shape}")
    num, den = num[den != 0], den[den != 0]
    n = num.size
    if n < max(2, min_n) or den.sum() <= 0:
        return (NAN, NAN)
    t = _t_quantile(level, n - 1)
    r = num.sum() / den.sum()
    se = float(((num - r * den) / den.mean()).std(ddof=1)) / math.sqrt(n)  # of r, linearized
    if upper is not None and 0.0 < r < upper:
        q = r / upper
        half = t * se / (upper * q * (1.0 - q))
        logit = math.log(q / (1.0 - q))
        return (upper / (1.0 + math.exp(-(logit - half))), upper / (1.0 + math.exp(-(logit + half))))
    if upper is None and r > 0:
        half = t * se / r
        return (float(r * math.exp(-half)), float(r * math.exp(half)))
    hi = r + t * se
    return (max(0.0, float(r - t * se)), float(min(hi, upper) if upper is not None else hi))


def mean_ci(
    values: Sequence[float], level: float = 0.95, min_n: int = MIN_PROMPTS_FOR_CI
) -> tuple[float, float, float]:
    """Mean and t-interval of one value per unit (NaNs dropped); no interval below ``min_n`` units."""
    v = np.asarray([x for x in values if x == x], dtype=float)
    if v.size == 0:
        return NAN, NAN, NAN
    if v.size < max(2, min_n):
        return float(v.mean()), NAN, NAN
    half = _t_quantile(level, v.size - 1) * float(v.std(ddof=1)) / math.sqrt(v.size)
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def log_mean_ci(
    values: Sequence[float], level: float = 0.95, min_n: int = MIN_PROMPTS_FOR_CI
) -> tuple[float, float, float]:
    """Geometric mean and its interval for a quantity that is positive by nature (a rate): the
    t-interval of the logs (:func:`mean_ci`) taken back by exp, so both bounds stay above zero and the
    interval is as wide in ratio below the centre as above it.  NaN when a value is not positive."""
    v = [x for x in values if x == x]
    if not v or any(x <= 0 or math.isinf(x) for x in v):
        return NAN, NAN, NAN
    centre, lo, hi = mean_ci([math.log(x) for x in v], level, min_n)
    return math.exp(centre), math.exp(lo) if lo == lo else NAN, math.exp(hi) if hi == hi else NAN


def relative_half_width(estimate: float, ci: tuple[float, float]) -> float:
    """(hi − lo) / 2 / estimate: the precision a study's stopping rule targets; NaN without an interval."""
    lo, hi = ci
    if not (estimate == estimate and lo == lo and hi == hi) or estimate <= 0:
        return NAN
    return (hi - lo) / 2.0 / estimate
