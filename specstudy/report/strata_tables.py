"""Strata frames (turns, input-length tiers, entropy tiers) as the report prints them: the row's
method in words, the stratum's own columns, and α, AL and speedup with their intervals.  The numbers
come from :mod:`specstudy.analysis.strata`; only their wording is made here."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import pandas as pd

from .format import fmt, fmt_ci

#: marks a row that pools a flagged cell (see the report's Validity section)
FLAG_MARK = " ⚑"


def method_name(label: Any, gamma: float, flagged: bool = False) -> str:
    """``Prompt lookup γ=2`` (no γ for a method without one), marked when the row pools a flagged cell."""
    name = f"{label} γ={gamma:g}" if gamma == gamma and gamma else str(label)
    return name + (FLAG_MARK if flagged else "")


def method_names(labels: Iterable[Any], gammas: Iterable[float], flags: Iterable[Any]) -> list[str]:
    return [method_name(lab, g, bool(flag)) for lab, g, flag in zip(labels, gammas, flags)]


def strata_table(raw: pd.DataFrame, columns: Mapping[str, Callable[[pd.DataFrame], Any]]) -> pd.DataFrame:
    """A strata frame as the report prints it: the row's method, the stratum ``columns``, α, AL, speedup."""
    if raw.empty:
        return raw
    head = {
        "Framework": raw["framework"],
        "Method": method_names(raw["label"], raw["gamma"], raw.get("flagged", [""] * len(raw))),
        "Task": raw["task"],
        "Batch": raw["batch_size"],
    }
    n = raw["n_prompts"]
    tail = {
        "n (prompts)": n,
        "α": [fmt_ci(a, ci, 3, n=k) for a, ci, k in zip(raw["alpha"], raw["alpha_ci"], n)],
        "AL": [fmt_ci(a, ci, 2, n=k) for a, ci, k in zip(raw["al"], raw["al_ci"], n)],
        "Speedup": [fmt_ci(s, ci, 2, "×", n=k) for s, ci, k in zip(raw["speedup"], raw["speedup_ci"], n)],
    }
    return pd.DataFrame({**head, **{k: f(raw) for k, f in columns.items()}, **tail}).reset_index(drop=True)


def turn_table(raw: pd.DataFrame) -> pd.DataFrame:
    """The per-turn frame (:func:`specstudy.analysis.turns.turn_frame`) as the report prints it."""
    return strata_table(
        raw,
        {
            "Prefix cache": lambda d: ["on" if c else "off" if c is not None else "—" for c in d["prefix_cache"]],
            "Turn": lambda d: d["turn"],
            "Prefix-cache hit rate": lambda d: [fmt(v, 3) if v is not None else "—" for v in d["hit_rate"]],
        },
    )


def tier_table(raw: pd.DataFrame) -> pd.DataFrame:
    """The input-length tier frame (:func:`specstudy.analysis.tiers.tier_frame`) as the report prints it."""
    return strata_table(raw, {"Input tokens": lambda d: d["input_tokens"], "Prompts": lambda d: d["prompts"]})


def entropy_tier_table(raw: pd.DataFrame) -> pd.DataFrame:
    """The entropy tier frame (:func:`specstudy.analysis.tiers.entropy_tiers_shown`) as the report prints it."""
    return strata_table(raw, {"Entropy tier (AR output terciles)": lambda d: d["entropy_tier"]})
