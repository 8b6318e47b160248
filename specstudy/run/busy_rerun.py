"""A cell measured one after another (a server cell: llama.cpp, vLLM) while the machine was busy is
measured again with its partner, like a stalled one.

The in-time groups (reference, HF) are rerun in :func:`specstudy.run.in_time_group.run_in_time`.  A cell
an engine serves alone (one process per configuration) has its partner in another cell: when the
validity checks would flag it for a busy machine (steal, other processes, clock drop, another GPU
process: :func:`specstudy.analysis.validity.machine_findings`, the report's own rule) and the cell and
its paired baseline took at most the study's ``busy_rerun_budget_s`` together (and at most what the
study's ``cells_budget_s`` has left), the baseline is measured again and then the cell, next to each
other (the first attempts kept in ``stalled/``).  A busy
baseline is rerun alone: its speculative cells run after it.  The baseline's new records serve every
row paired with it.  What is still busy after the rerun stays flagged, and the progress note names it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from ..analysis import validity
from ..config import StudyConfig
from ..layout import StudyLayout
from ..report.validity_text import finding_text
from .cell import CellResult
from .plan import CellPlan


def _busy(layout: StudyLayout, cell_id: str) -> list[str]:
    if not layout.is_done(cell_id):
        return []
    return [finding_text(f) for f in validity.machine_findings(layout.read_part(cell_id)) if f.flags]


def _wall(layout: StudyLayout, cell_id: str) -> float:
    recs = layout.read_part(cell_id)
    return float((recs[0].extra or {}).get("cell_wall_s", 0.0)) if recs else 0.0


def out_of_time_note(busy: list[str], left_s: float) -> str:
    """What a busy cell or group not rerun for lack of the cells' budget says (it stays flagged)."""
    return f"busy machine ({'; '.join(busy)}): not rerun ({max(left_s, 0.0):.0f} s left of the cells' budget), flagged"


def rerun_if_busy(
    cfg: StudyConfig,
    plan: CellPlan,
    by_id: Mapping[str, CellPlan],
    layout: StudyLayout,
    run_one: Callable[[CellPlan], CellResult],
    time_left_s: Callable[[], float] = lambda: math.inf,
) -> list[CellResult]:
    """The cell measured; if busy and within the budget and what the cells' budget has left
    (``time_left_s``), its baseline (when it has one) and itself once more.  Returns every result, the
    first attempt's last (its note says what happened)."""
    first = run_one(plan)
    if first.status != "done" or cfg.busy_rerun_budget_s <= 0 or not (busy := _busy(layout, plan.cell_id)):
        return [first]
    base = by_id.get(plan.baseline_cell_id or "")
    arms = [p for p in (base, plan) if p is not None and layout.is_done(p.cell_id)]
    cost = sum(_wall(layout, p.cell_id) for p in arms)
    if cost > cfg.busy_rerun_budget_s:
        first.note = f"busy machine ({'; '.join(busy)}): not rerun ({cost:.0f} s > budget {cfg.busy_rerun_budget_s:g} s), flagged"
        return [first]
    if cost > (left := time_left_s()):
        first.note = out_of_time_note(busy, left)
        return [first]
    for p in arms:
        layout.write_stalled(p.cell_id, layout.read_part(p.cell_id))  # kept beside, read by no table
    again = [run_one(p) for p in arms]
    for p in arms:  # the Validity section's reruns table names them (report.validity_text.reruns_frame)
        if layout.is_done(p.cell_id):
            recs = layout.read_part(p.cell_id)
            for r in recs:
                r.extra.update(attempt=2, first_attempt_busy=busy)
            layout.write_part(p.cell_id, recs)
    still = [p.cell_id for p in arms if _busy(layout, p.cell_id)]
    note = f"busy machine ({'; '.join(busy)}), measured again with {'its baseline' if base in arms else 'no partner'}: "
    again[-1].note = note + (f"still busy, flagged: {', '.join(still)}" if still else "quiet")
    return again
