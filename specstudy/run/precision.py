"""Precision targets instead of a fixed n: the cells a sweep's stopping rule still asks for.

A speculative cell of a sweep with ``precision:`` starts with the sweep's ``prompts_per_task``
prompts (the minimum n).  After the planned cells, each such row (the cell with its repeats) is
measured from the records on disk: while its paired speedup's 95 % interval half-width is above
``rel_half_width`` of the speedup and it has fewer than ``max_prompts`` distinct prompts, the next
``step`` prompts of the task run as an *extension*: a cell of its own for the speculative method
and one for its baseline (shared by every method paired with that baseline).  Extensions have
fixed offsets and ids, so a rerun finds the finished ones on disk and decides again from the same
records: a study that dies halfway loses nothing.

The rule is sequential: a row stops on its interval only from ``min_prompts`` prompts on (the
first look), which keeps the reported 95 % interval's coverage near nominal for the per-prompt
speedup distributions simulated in tests/run/test_precision_rule.py.  Rows short of their target
are extended one chunk at a time while their sweep's ``budget_s`` of extension time lasts and the
study's ``cells_budget_s`` (when set) has room for the chunk: first the row expected to reach its
target soonest within that budget (a half-width shrinks as 1/√n; each row's prompts cost what its
arms' requests took), else the row whose next chunk narrows its interval (relative to its target) the
most per second; each row's stop (reached,
budget, the study's time, prompts exhausted) is recorded beside the records for the report.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from .. import intervals, metrics
from ..config import StudyConfig
from ..layout import StudyLayout
from ..records import CONTROL_FAMILY, RequestRecord
from .plan import CellPlan, extension


def target_of(cfg: StudyConfig, plan: CellPlan) -> dict[str, Any] | None:
    """The first precision target among the sweeps the cell belongs to, with its sweep's name under
    ``sweep`` (None: a fixed n); an A/A control's is the study's ``aa_precision``, with a budget of its
    own per framework (:func:`control_sweep`)."""
    if plan.family == CONTROL_FAMILY:
        return {**dict(cfg.aa_precision), "sweep": control_sweep(plan.cell.framework)} if cfg.aa_precision else None
    for sw in cfg.sweeps:
        if sw.name in plan.sweeps and sw.precision is not None:
            return {**dict(sw.precision), "sweep": sw.name}
    return None


def control_sweep(framework: str) -> str:
    """The budget key of a framework's A/A control: each control spends ``aa_precision.budget_s`` of its
    own, since a prompt costs the reference engine ten times what it costs llama.cpp (one shared budget
    went to the reference control's first chunk and left llama.cpp's, ±10 % at 5 prompts, unextended:
    make study of 2026-12-07 23:37)."""
    return f"{CONTROL_FAMILY} ({framework})"


def target_met(rel_half_width: float, n_prompts: int, minimum: int, target: float) -> bool:
    """The stopping rule: at least ``minimum`` prompts and an interval within ``target`` of the estimate.

    The minimum guards the rule's coverage: stopping as soon as an interval looks narrow favours
    samples that are narrow by chance (simulated in tests/run/test_precision_rule.py).
    """
    return n_prompts >= minimum and rel_half_width == rel_half_width and rel_half_width <= target


def _records(layout: StudyLayout, ids: Iterable[str]) -> list[RequestRecord]:
    return [r for cid in ids if layout.is_done(cid) for r in layout.read_part(cid)]


def row_precision(layout: StudyLayout, spec_ids: Sequence[str], base_ids: Sequence[str]) -> tuple[float, int, float]:
    """(relative half-width of the paired speedup interval, distinct prompts, seconds a prompt costs the
    row: its baseline and speculative requests' mean E2E) over a row's cells on disk."""
    base, spec = _records(layout, base_ids), _records(layout, spec_ids)
    sp = metrics.paired_speedup(base, spec)
    b, s = metrics.paired_latencies(base, spec)
    prompt_s = float((b + s).mean()) if b.size else math.nan
    return intervals.relative_half_width(sp["speedup"], (sp["ci_low"], sp["ci_high"])), int(sp["n_prompts"]), prompt_s


def _rows(plans: Sequence[CellPlan]) -> dict[str, list[CellPlan]]:
    """Speculative cells grouped with their repeats, keyed by the repeat-0 cell's id."""
    rows: dict[str, list[CellPlan]] = {}
    for p in plans:
        if not p.is_baseline and p.prompt_offset == 0:
            root = dataclasses.replace(p.cell, repeat=0, id="").identity_id()
            rows.setdefault(root, []).append(p)
    return {k: sorted(v, key=lambda p: p.cell.repeat) for k, v in rows.items()}


def _chunks(root: CellPlan, base: CellPlan, target: dict[str, Any]) -> Iterator[tuple[CellPlan, CellPlan]]:
    """(baseline, speculative) extension cells in order: the task's next ``step`` prompts up to the cap."""
    offset = root.prompts
    while offset < target["max_prompts"]:
        count = min(target["step"], target["max_prompts"] - offset)
        base_ext = extension(base, offset, count)
        yield base_ext, extension(root, offset, count, base_ext.cell_id)
        offset += count


def _targeted(cfg: StudyConfig, plans: Sequence[CellPlan]) -> Iterator[tuple[list[CellPlan], CellPlan, dict[str, Any]]]:
    """(the row's cells, its baseline, its target) for every row a sweep's precision target applies to."""
    by_id = {p.cell_id: p for p in plans}
    for cells in _rows(plans).values():
        root, target = cells[0], target_of(cfg, cells[0])
        base = by_id.get(root.baseline_cell_id or "")
        if target is not None and base is not None and root.cell.repeat == 0:
            yield cells, base, target


def most_extensions(cfg: StudyConfig, plans: Sequence[CellPlan]) -> list[CellPlan]:
    """Every extension cell the precision targets could add (no target met): what a dry run sizes."""
    out: dict[str, CellPlan] = {}
    for cells, base, target in _targeted(cfg, plans):
        out.update({p.cell_id: p for pair in _chunks(cells[0], base, target) for p in pair})
    return list(out.values())


#: why a row stopped growing (the report's words come from these keys)
REACHED, BUDGET, EXHAUSTED, NOT_RUN = "reached", "budget", "prompts exhausted", "not run"
#: the study's ``cells_budget_s`` had no room left for the row's next chunk
STUDY_TIME = "study time"


@dataclasses.dataclass
class RowState:
    """A targeted row as its records on disk leave it: precision, prompts, and the next extension."""

    sweep: str
    target: dict[str, Any]
    spec_ids: list[str]
    half: float
    n: int
    minimum: int
    pending: tuple[CellPlan, CellPlan] | None  # (baseline, speculative) of the next chunk; None: the cap
    prompt_s: float = math.nan  # what one more prompt costs it (its arms' mean E2E per prompt so far)

    @property
    def met(self) -> bool:
        return target_met(
            self.half, self.n, max(self.minimum, int(self.target["min_prompts"])), self.target["rel_half_width"]
        )

    @property
    def seconds_to_target(self) -> float:
        """The extension seconds it should still need: a half-width shrinks as 1/√n, so about
        n·((half / target)² − 1) more prompts (and up to its minimum), each at its own cost so far
        (inf without an interval or a cost)."""
        if not (self.half == self.half and self.prompt_s == self.prompt_s):
            return math.inf
        floor = max(self.minimum, int(self.target["min_prompts"])) - self.n
        more = max(self.n * ((self.half / float(self.target["rel_half_width"])) ** 2 - 1.0), floor, 0.0)
        return float(more * self.prompt_s)

    @property
    def chunk_s(self) -> float:
        """What its next chunk should cost: its prompts at its own cost per prompt (NaN: no cost yet)."""
        if self.pending is None:
            return math.nan
        return float(self.pending[1].prompts * self.prompt_s)

    def narrowing_per_s(self, chunk_s: float) -> float:
        """How much its next chunk should narrow its half-width relative to its target, per second of the
        chunk: width·(1 − √(n / (n + chunk prompts))) / chunk seconds (a half-width shrinks as 1/√n).  No
        interval yet or no cost known: infinite (it goes first, as the widest did)."""
        if self.pending is None or not math.isfinite(self.width) or not chunk_s > 0:
            return math.inf
        n, more = max(self.n, 1), self.pending[1].prompts
        return float(self.width * (1.0 - math.sqrt(n / (n + more))) / chunk_s)

    @property
    def width(self) -> float:
        """Half-width relative to the target (no interval yet: the widest of all)."""
        return self.half / self.target["rel_half_width"] if self.half == self.half else math.inf


def row_states(
    cfg: StudyConfig, plans: Sequence[CellPlan], layout: StudyLayout
) -> tuple[list[CellPlan], list[RowState]]:
    """(the extension cells on disk, every targeted row's state)."""
    done: dict[str, CellPlan] = {}
    states: list[RowState] = []
    for cells, base, target in _targeted(cfg, plans):
        root = cells[0]
        spec_ids = [p.cell_id for p in cells]
        base_ids = [p.baseline_cell_id or "" for p in cells]
        pending = None
        for base_ext, spec_ext in _chunks(root, base, target):
            if not (layout.is_done(spec_ext.cell_id) and layout.is_done(base_ext.cell_id)):
                pending = (base_ext, spec_ext)
                break
            spec_ids.append(spec_ext.cell_id)
            base_ids.append(base_ext.cell_id)
            done.update({base_ext.cell_id: base_ext, spec_ext.cell_id: spec_ext})
        half, n, prompt_s = row_precision(layout, spec_ids, base_ids)
        states.append(RowState(target["sweep"], target, spec_ids, half, n, root.prompts, pending, prompt_s))
    return list(done.values()), states


def short_rows(states: Iterable[RowState]) -> list[RowState]:
    """The rows that still need an extension, the widest interval (relative to its target) first."""
    return sorted((s for s in states if s.pending is not None and not s.met), key=lambda s: -s.width)


def extensions(
    cfg: StudyConfig, plans: Sequence[CellPlan], layout: StudyLayout
) -> tuple[list[CellPlan], list[CellPlan]]:
    """(the extension cells on disk, the ones the rows short of their target need next: widest row
    first, each row's baseline before its speculative cell)."""
    done, states = row_states(cfg, plans, layout)
    out: dict[str, CellPlan] = {}
    for s in short_rows(states):
        for p in s.pending or ():
            if not layout.is_done(p.cell_id):
                out.setdefault(p.cell_id, p)
    return done, list(out.values())


def stop_reason(
    state: RowState, spent_s: Mapping[str, float], cost_s: Mapping[str, float], time_left_s: float = math.inf
) -> str:
    """Why the row stopped: its target reached, its sweep's budget spent, no room left in the study's
    cells budget, the prompts (cap) exhausted, or not run (a cell limit, a failed extension)."""
    if state.met:
        return REACHED
    if state.pending is None:
        return EXHAUSTED
    if not _affordable(state, spent_s, cost_s):
        return BUDGET
    return NOT_RUN if _fits(state, cost_s, time_left_s) else STUDY_TIME


def _affordable(state: RowState, spent_s: Mapping[str, float], cost_s: Mapping[str, float]) -> bool:
    """Whether the row's sweep has budget left for its next chunk (:func:`_next_chunk_s`: a sweep's rows
    may differ tenfold, an A/A control on llama.cpp and on the reference engine)."""
    budget = state.target.get("budget_s")
    return budget is None or spent_s.get(state.sweep, 0.0) + _next_chunk_s(state, cost_s) <= float(budget)


def _next_chunk_s(state: RowState, cost_s: Mapping[str, float]) -> float:
    """What the row's next chunk should cost: its own prompts at their cost so far, else its sweep's last
    chunk's cost (else 0)."""
    return state.chunk_s if state.chunk_s == state.chunk_s else cost_s.get(state.sweep, 0.0)


def _fits(state: RowState, cost_s: Mapping[str, float], time_left_s: float) -> bool:
    """Whether the row's next chunk should end within the study's time left (``cells_budget_s``)."""
    return _next_chunk_s(state, cost_s) <= time_left_s


def _left_s(state: RowState, spent_s: Mapping[str, float]) -> float:
    budget = state.target.get("budget_s")
    return math.inf if budget is None else float(budget) - float(spent_s.get(state.sweep, 0.0))


def next_row(
    states: Sequence[RowState],
    spent_s: Mapping[str, float],
    cost_s: Mapping[str, float],
    failed: set[str],
    time_left_s: float = math.inf,
) -> RowState | None:
    """The row short of its target to extend next, among those whose sweep can afford one more chunk, whose
    chunk fits the study's time left and has not failed in this run (None: every row reached, ran out of
    prompts or of budget):
    precision where it is cheapest, the row expected to reach its target within what its sweep has left
    in the fewest seconds; when none is, the row whose next chunk should narrow its interval (relative to
    its target) the most per second (:meth:`RowState.narrowing_per_s`)."""
    ready = [
        s
        for s in short_rows(states)
        if _affordable(s, spent_s, cost_s)
        and _fits(s, cost_s, time_left_s)
        and not any(p.cell_id in failed for p in s.pending or ())
    ]
    within = [s for s in ready if s.seconds_to_target <= min(_left_s(s, spent_s), time_left_s)]
    if within:
        return min(within, key=lambda s: s.seconds_to_target)
    return max(ready, key=lambda s: s.narrowing_per_s(_next_chunk_s(s, cost_s))) if ready else None


def precision_doc(
    states: Sequence[RowState],
    spent_s: Mapping[str, float],
    cost_s: Mapping[str, float],
    time_left_s: float = math.inf,
) -> dict[str, Any]:
    """Per speculative cell of a targeted row (extensions included): the row's target, reached
    half-width, prompts and stop; per sweep the budget and the seconds spent; the study's time left."""
    cells: dict[str, Any] = {}
    for s in states:
        row = {
            "sweep": s.sweep,
            "target": s.target["rel_half_width"],
            "half_width": s.half if s.half == s.half else None,
            "n_prompts": s.n,
            "max_prompts": s.target["max_prompts"],
            "stopped": stop_reason(s, spent_s, cost_s, time_left_s),
        }
        cells.update({cid: row for cid in s.spec_ids})
    budgets = {
        s.sweep: {
            "budget_s": s.target.get("budget_s"),
            "spent_s": round(spent_s.get(s.sweep, 0.0), 3),
            "last_chunk_s": round(cost_s.get(s.sweep, 0.0), 3),
        }
        for s in states
    }
    left = None if math.isinf(time_left_s) else round(max(time_left_s, 0.0), 1)
    return {"cells": cells, "sweeps": budgets, "study_time_left_s": left}


def spent_before(doc: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """(seconds spent, last chunk's seconds) per sweep from an earlier run's ``precision.json``: a rerun
    goes on with the same budget, it does not get a fresh one (a finished study's rerun adds nothing)."""
    sweeps = doc.get("sweeps", {})
    return (
        {k: float(v.get("spent_s") or 0.0) for k, v in sweeps.items()},
        {k: float(v.get("last_chunk_s") or 0.0) for k, v in sweeps.items()},
    )
