"""Verdicts and estimates in words: the only place the report's claims are phrased.

Why here: :mod:`specstudy.analysis.claims` decides each verdict from intervals and returns it as a
value; how it reads (and how an estimate with its interval prints) is the report's business, so
the same verdict always reads the same way in the tables, the sections and the summary.
"""

from __future__ import annotations

from typing import Any

from ..analysis.claims import (
    CANNOT_TELL,
    N_TOO_SMALL,
    NEAR_TIE_NATS,
    OBSERVED,
    REVERSED,
    VERDICTS,
    Estimate,
    finite,
    memory_verdict,
    side,
)
from ..analysis.stats import break_even, isnum
from ..intervals import MIN_PROMPTS_FOR_CI
from .format import fmt_ci


def estimate_text(est: Estimate, digits: int = 2, suffix: str = "×") -> str:
    """``1.24× [1.11, 1.35]``, or ``1.24× (n too small)``: as the tables print it."""
    return fmt_ci(est.value, est.ci, digits, suffix, n=est.n)


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
    near = [d for d in divs if finite(d.get("margin")) and abs(d["margin"]) < NEAR_TIE_NATS]
    far = [d for d in divs if finite(d.get("margin")) and abs(d["margin"]) >= NEAR_TIE_NATS]
    unknown = [d for d in divs if not finite(d.get("margin"))]
    shown = sorted(far, key=lambda d: -abs(d["margin"])) + unknown + near

    def where(d: dict[str, Any]) -> str:
        batch = f", batch {d['batch_size']}" if "batch_size" in d else ""
        m = f"margin {d['margin']:+.3f} nats" if finite(d.get("margin")) else "margin unknown"
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


def break_even_notes(multi: Any) -> list[str]:
    """Per (label, γ) of a frame with several batch sizes: where the measured speedup falls below 1×."""
    notes = []
    for (label, gamma), g in multi.groupby(["label", "gamma"]):
        g = g.sort_values("batch_size")
        be = break_even(g["batch_size"].tolist(), g["speedup"].tolist())
        first = g["speedup"].iloc[0]
        if be is not None and isnum(first) and first < 1.0:
            notes.append(
                f"{label} γ={gamma}: below 1× already at batch {g['batch_size'].iloc[0]} (no break-even to mark)"
            )
        elif be is not None:
            notes.append(f"{label} γ={gamma}: speedup falls below 1× at batch ≈ {be:.1f} (measured, interpolated)")
        else:
            notes.append(f"{label} γ={gamma}: no break-even within the measured batch sizes")
    return notes
