"""How numbers and names read in tables: values with their CI, short model names, section titles."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..frameworks import eagle_methods, seed_row
from ..intervals import MIN_PROMPTS_FOR_CI

TASK_TITLES = {
    "code": "Code generation",
    "translation": "Translation",
    "summarization": "Summarization",
    "qa": "General QA",
    "creative_writing": "Creative writing",
    "math": "Math reasoning",
    "chat": "Dialogue / chat",
}
#: what an EAGLE chain is called beside the seed's EAGLE-2 row: EAGLE-2's addition is its dynamic tree
EAGLE_CHAIN_ROW = "EAGLE-2 (chain only, no dynamic tree)"


def seed_row_name(method: str, dynamic_tree: bool = False) -> str:
    """The seed's row name for a kit method (its hardware tables; the method's header or engine
    declaration says it), or — when the seed has none.  An EAGLE method is the seed's EAGLE-2 row
    only with its dynamic tree (records whose extra has ``tree: eagle2_dynamic``, :func:`is_dynamic_tree`)."""
    if method in eagle_methods() and not dynamic_tree:
        return EAGLE_CHAIN_ROW
    return seed_row(method) or "—"


#: how a row's pairs were timed (:class:`specstudy.analysis.pairing.ArmsApart`), in words
ORDER_WORDS = {
    "in_time": "in time",
    "cell_after_cell": "cell after cell",
    "mixed": "some in time",
    "unknown": "order unknown",
}


def apart_text(seconds: float, order: str) -> str:
    """How far apart a row's two arms were timed: the median seconds (minutes past a minute) between
    a pair's starts, and in which order (in time, cell after cell)."""
    if seconds != seconds:
        return "—"
    span = f"{seconds:.1f} s" if seconds < 60 else f"{seconds / 60:.1f} min"
    return f"{span} ({ORDER_WORDS.get(order, order)})"


def fmt(x: Any, digits: int = 2, suffix: str = "") -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "—"
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return f"{x}{suffix}"
    return f"{x:.{digits}f}{suffix}"


def fmt_ci(x: Any, ci: tuple[float, float], digits: int = 2, suffix: str = "", n: int | None = None) -> str:
    """``2.31× [2.10, 2.52]``: the value and its 95 % CI (— when not computable).

    With ``n`` (distinct prompts) below :data:`specstudy.intervals.MIN_PROMPTS_FOR_CI` the value is
    marked ``(n too small)``: no interval method holds there, so none is printed.
    """
    s = fmt(x, digits, suffix)
    if s == "—":
        return s
    if n is not None and n < MIN_PROMPTS_FOR_CI:
        return f"{s} (n too small)"
    lo, hi = ci
    if lo == lo and hi == hi:
        return f"{s} [{lo:.{digits}f}, {hi:.{digits}f}]"
    return s


#: a sampling key's parts (:func:`specstudy.analysis.study_records.sampling_key`) in words
SAMPLING_PARTS = {"T": "T={}", "p": "top-p {}", "k": "top-k {}"}


def sampling_text(key: str) -> str:
    """``T=0.7, top-p 0.9`` for the key ``T0.7_p0.9`` (``greedy`` as is): how a cell sampled, in words."""
    if key == "greedy":
        return key
    parts = str(key).split("_")
    if any(p[:1] not in SAMPLING_PARTS for p in parts):
        raise ValueError(f"sampling key {key!r}: expected greedy or parts {sorted(SAMPLING_PARTS)} joined by _")
    return ", ".join(SAMPLING_PARTS[p[0]].format(p[1:]) for p in parts)


def short_model(name: str | None) -> str:
    if not name:
        return "—"
    if str(name) == "self" or str(name).startswith("self:"):
        k = str(name).partition(":")[2]
        return f"target's first {k} layers" if k else "target's first half"
    if str(name).endswith(".safetensors"):
        return Path(str(name)).stem
    return Path(str(name)).name if ("/" in str(name) and Path(str(name)).exists()) else str(name).split("/")[-1]
