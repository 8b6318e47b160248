"""The acceptance gate's words: a golden row's name and why it moved (``specstudy check`` prints them)."""

from __future__ import annotations

from ..analysis.golden import Moved, row_fields


def row_name(key: str) -> str:
    """``framework=reference | label=Early exit | task=code | ...``: a row as the gate names it."""
    return " | ".join(f"{k}={v}" for k, v in row_fields(key).items())


def moved_text(m: Moved) -> str:
    """Why a row fails the gate, in words."""
    if m.what == "missing":
        return "row missing from the study"
    if m.what == "no_common_prompts":
        return "no prompt in common with the golden"
    if m.what == "depth":
        return f"per-position depth {m.before} -> {m.after}"
    if m.what == "position":
        return f"position {m.position} acceptance {m.before} -> {m.after}"
    return f"{m.what} {m.before} -> {m.after}"
