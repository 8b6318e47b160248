"""Verdicts on the seed's expectations, decided from intervals, never from point values.

Why: a sentence written by hand ("short outputs leave little decode time to save") can sit above a
table that shows the reverse.  Every effect the report states goes through :func:`verdict`,
:func:`compare` or :func:`resolved` and is worded by :func:`phrase`, so the text says what this
study observed, the reverse of it, or that it cannot tell.  Pure: numbers in, words out; the
estimates and intervals themselves are :mod:`specstudy.metrics`'s (via :class:`stats.Pooled`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ..metrics import MIN_PROMPTS_FOR_CI
from .format import fmt_ci

Direction = Literal["above", "below"]

OBSERVED = "observed"  # the interval excludes the threshold on the side the seed expects
REVERSED = "reversed"  # it excludes the threshold on the other side
CANNOT_TELL = "cannot tell"  # the interval contains the threshold (two rows: their intervals overlap)
N_TOO_SMALL = "n too small"  # no interval (fewer than MIN_PROMPTS_FOR_CI prompts)
VERDICTS = (OBSERVED, REVERSED, CANNOT_TELL, N_TOO_SMALL)

#: a greedy flip where the target's two candidates differ by less than this (nats) is a near-tie
NEAR_TIE_NATS = 0.05


def _finite(x: object) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool) and math.isfinite(x)


@dataclass(frozen=True)
class Estimate:
    """An estimate, its 95 % interval and its n (distinct prompts): what a verdict is decided from."""

    value: float
    ci: tuple[float, float]
    n: int

    @classmethod
    def of(cls, row: Any, name: str = "speedup") -> Estimate:
        """``name``, its ``_ci`` and ``n_prompts`` of a :class:`~.stats.Pooled` (or a frame row of one)."""
        value = getattr(row, name)
        lo, hi = getattr(row, f"{name}_ci")
        return cls(float(value) if _finite(value) else math.nan, (float(lo), float(hi)), int(row.n_prompts))

    @property
    def has_interval(self) -> bool:
        lo, hi = self.ci
        return self.n >= MIN_PROMPTS_FOR_CI and _finite(self.value) and _finite(lo) and _finite(hi)

    def text(self, digits: int = 2, suffix: str = "×") -> str:
        """``1.24× [1.11, 1.35]``, or ``1.24× (n too small)``: as the tables print it."""
        return fmt_ci(self.value, self.ci, digits, suffix, n=self.n)


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
    if not (_finite(delta) and _finite(noise)):
        return N_TOO_SMALL
    if abs(delta) <= noise:
        return CANNOT_TELL
    return OBSERVED if delta > 0 else REVERSED


def _no_interval(n: int | None) -> str:
    if n is not None and n >= MIN_PROMPTS_FOR_CI:
        return f"no interval could be computed (n = {n} prompts)"
    few = f" (n = {n} prompts; an interval needs ≥ {MIN_PROMPTS_FOR_CI})" if n is not None else ""
    return f"n too small for an interval{few}"


def phrase(v: str, *, n: int | None = None, against: str = "1×", rows: int = 1) -> str:
    """A verdict as the sentence fragment that ends a claim.

    ``rows=2`` words a comparison of two rows (intervals overlapping, not containing a threshold);
    ``against`` names the threshold an interval contains; ``n`` the prompts of an n-too-small row.
    """
    if v == OBSERVED:
        return "as the seed expects (observed in this study)"
    if v == REVERSED:
        return "the reverse of the seed's expectation (observed in this study)"
    if v == CANNOT_TELL:
        if rows == 2:
            return (
                "the intervals overlap, so this study cannot tell (overlap is a conservative test: "
                "a smaller real difference is not ruled out)"
            )
        return f"the interval contains {against}: no difference resolvable, this study cannot tell"
    if v == N_TOO_SMALL:
        return f"{_no_interval(n)}: this study cannot tell"
    raise ValueError(f"verdict={v!r}: one of {VERDICTS}")


def versus(est: Estimate, threshold: float = 1.0, what: str = "AR") -> str:
    """A speedup against 1× in words, with no expectation: faster / slower / not resolvable."""
    s = side(est, threshold)
    if s == "above":
        return f"faster than {what} (interval above {threshold:g}×)"
    if s == "below":
        return f"slower than {what} (interval below {threshold:g}×)"
    if s == "contains":
        return f"no difference from {what} resolvable (interval contains {threshold:g}×)"
    return f"{_no_interval(est.n)}: whether it beat {what} cannot be told"


def memory_verdict(delta: float, noise: float) -> str:
    """:func:`resolved` at the 0.1 MB the report prints: a difference that prints as large as the
    noise ("+50.2 MB" against "±50.2 MB") is a tie, not beyond it."""
    if not (_finite(delta) and _finite(noise)):
        return N_TOO_SMALL
    return resolved(round(delta / 1e5) * 1e5, round(noise / 1e5) * 1e5)


def memory_phrase(v: str, noise: float) -> str:
    """A memory verdict's closing words: in MB against the noise, never an interval against 1×."""
    if v == CANNOT_TELL:
        return f"no difference beyond the ±{noise / 1e6:.1f} MB noise: this study cannot tell"
    return phrase(v)


def memory_text(delta: float, noise: float, source: str) -> str:
    """A peak-memory difference as a resolved signed number, or as unresolvable within the source's noise."""
    v = memory_verdict(delta, noise)
    if v == N_TOO_SMALL:
        return "—"
    if v == CANNOT_TELL:
        return f"no difference resolvable: |Δ| ≤ {noise / 1e6:.1f} MB ({source})"
    return f"{delta / 1e6:+.1f} MB (beyond the ±{noise / 1e6:.1f} MB noise of {source})"


def _prompt(d: dict[str, Any]) -> str:
    pid, task = str(d.get("prompt_id")), str(d.get("task"))
    return pid if pid.startswith(task) else f"{task}/{pid}"


def divergence_text(divs: list[dict[str, Any]], most: int = 3) -> str:
    """Greedy flips (``stats.divergences`` dicts) in words: where each happened, and what the target's margin says.

    A flip where the target's two candidates are within :data:`NEAR_TIE_NATS` is a near-tie (batched
    numerics can tip it); a wider margin is one a lossless method should not flip; without
    log-probabilities the reader is told that it is unknown which of the two it was.
    """
    if not divs:
        return ""
    near = [d for d in divs if _finite(d.get("margin")) and abs(d["margin"]) < NEAR_TIE_NATS]
    far = [d for d in divs if _finite(d.get("margin")) and abs(d["margin"]) >= NEAR_TIE_NATS]
    unknown = [d for d in divs if not _finite(d.get("margin"))]
    shown = sorted(far, key=lambda d: -abs(d["margin"])) + unknown + near

    def where(d: dict[str, Any]) -> str:
        batch = f", batch {d['batch_size']}" if "batch_size" in d else ""
        m = f"margin {d['margin']:+.3f} nats" if _finite(d.get("margin")) else "margin unknown"
        at = f"first differs at output position {d['position']} ({m})"
        return f"prompt {_prompt(d)} (repeat {d.get('repeat')}{batch}) {at}"

    text = "; ".join(where(d) for d in shown[:most]) + (f"; and {len(shown) - most} more" if len(shown) > most else "")
    parts = [f"Where: {text}."]
    if near:
        parts.append(
            f"{len(near)} {'is a near-tie' if len(near) == 1 else 'are near-ties'} (|margin| < {NEAR_TIE_NATS} nats): "
            "a near-tie flip from batched numerics is not a verification bug, but the reader must be told."
        )
    if far:
        top = max(abs(d["margin"]) for d in far)
        parts.append(
            f"{len(far)} {'is' if len(far) == 1 else 'are'} not a near-tie (|margin| up to {top:.3f} nats): a lossless "
            "method should not flip there, so its verification needs checking."
        )
    if unknown:
        parts.append(
            f"For {len(unknown)} the engine gives no log-probabilities, so whether "
            f"{'it was a near-tie' if len(unknown) == 1 else 'they were near-ties'} is unknown."
        )
    return " ".join(parts)
