"""What stopped a headline row's prompts from growing, in words, from the run's ``precision.json``.

The runner (:mod:`specstudy.run.precision`) records per targeted cell the row's stop: its target
reached, its sweep's extension budget spent, no room left in the study's cells budget
(``cells_budget_s``), the task's prompts up to the cap exhausted, or not run (a cell limit, a failed
extension).  A headline row pools cells of several tasks: the first stop
other than reached, in that order of cost, names why the row as a whole is short.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..analysis.study_records import Study

_ORDER = ("budget", "study time", "prompts exhausted", "not run")


def _words(stop: str, row: dict[str, Any], doc: dict[str, Any]) -> str:
    if stop == "budget":
        sw = doc.get("sweeps", {}).get(row["sweep"], {})
        return f"budget: {sw.get('spent_s', 0):.3g} s of the sweep's {sw.get('budget_s', 0):g} s of extensions spent"
    if stop == "study time":
        left = doc.get("study_time_left_s") or 0.0
        return f"study time: {left:.0f} s left of the cells' budget, less than the row's next prompts cost"
    if stop == "prompts exhausted":
        return f"prompts exhausted: {row['max_prompts']} per task, the cap"
    return "not run: a cell limit or a failed extension stopped it"


def stop_text(study: Study, cell_ids: Sequence[str]) -> str | None:
    """Why the row's cells stopped short of their target (None: each reached it, or no record of it)."""
    doc = study.layout.read_precision()
    rows = [doc.get("cells", {}).get(c) for c in cell_ids]
    stops = {r["stopped"]: r for r in rows if r}
    for stop in _ORDER:
        if stop in stops:
            return _words(stop, stops[stop], doc)
    return None


def target_words(half: float, goal: float, why: str) -> str:
    """A precision target in words: "±3 % reached" when the half-width is within it, else
    "±3 % not met: <why>" (a half-width that is not a number is not within it)."""
    target = f"±{100 * goal:g} %"
    return f"{target} reached" if half <= goal else f"{target} not met: {why}"
