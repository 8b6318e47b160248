"""The `predict --from` table in words: where each row's step costs came from and its note (the
assumptions its measurement bends, how far its optimal γ was searched, whether it extrapolates).
The numbers and those facts come from :func:`specstudy.analysis.predict_elsewhere.predict_from_study`."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..analysis.stats import isnum
from .format import sampling_text
from .model_notes import limit_text, note_text

#: the data columns of a prediction that the worded ``costs`` and ``note`` replace
FACTS = (
    "costs_from",
    "cost_profile",
    "cost_profile_source",
    "cost_target_params",
    "cost_dtype",
    "search_why",
    "search_depth",
    "extrapolated",
    "alpha_assumed",
    "bends",
)


def costs_text(row: dict[str, Any]) -> str:
    """``measured (this study)``, or the roofline profile, parameter count and dtype the row assumed."""
    if row["costs_from"] == "measured":
        return "measured (this study)"
    return (
        f"roofline ({row['cost_profile']}, {row['cost_profile_source']}), "
        f"{row['cost_target_params']:.3g} parameters {row['cost_dtype']}"
    )


def prediction_note(row: dict[str, Any]) -> str:
    """A row's model note and how far its optimal γ was searched (and whether it extrapolates)."""
    parts = [note_text(row["bends"])] if row["bends"] else []
    cap = row["searched_gamma_max"]
    parts.append(f"γ searched ≤ {cap} ({limit_text(row['search_why'], cap)})")
    if row["extrapolated"]:
        alpha = row["alpha_assumed"]
        a = f"α̂ = {alpha:.2f}" if isnum(alpha) else "α̂"
        depth = row["search_depth"]
        parts.append(f"optimal γ={row['optimal_gamma']} EXTRAPOLATED past measured depth {depth} ({a} assumed there)")
        if row["costs_from"] == "measured":
            parts.append(f"verify cost past k={depth} taken as at the largest k timed")
    return "; ".join(parts)


def predict_table(df: pd.DataFrame) -> pd.DataFrame:
    """The predictions as a reader sees them: the numbers, then ``costs`` and ``note`` in words."""
    if df.empty:
        return df
    rows = df.to_dict("records")
    return df.drop(columns=[c for c in FACTS if c in df.columns]).assign(
        sampling=df["sampling"].map(sampling_text),
        costs=[costs_text(r) for r in rows],
        note=[prediction_note(r) for r in rows],
    )
