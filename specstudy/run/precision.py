"""Precision targets instead of a fixed n: the cells a sweep's stopping rule still asks for.

A speculative cell of a sweep with ``precision:`` starts with the sweep's ``prompts_per_task``
prompts (the minimum n).  After the planned cells, each such row (the cell with its repeats) is
measured from the records on disk: while its paired speedup's 95 % interval half-width is above
``rel_half_width`` of the speedup and it has fewer than ``max_prompts`` distinct prompts, the next
``step`` prompts of the task run as an *extension*: a cell of its own for the speculative method
and one for its baseline (shared by every method paired with that baseline).  Extensions have
fixed offsets and ids, so a rerun finds the finished ones on disk and decides again from the same
records: a study that dies halfway loses nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from .. import intervals, metrics
from ..config import StudyConfig
from ..layout import StudyLayout
from ..records import RequestRecord
from .plan import CellPlan, extension


def target_of(cfg: StudyConfig, plan: CellPlan) -> dict[str, Any] | None:
    """The first precision target among the sweeps the cell belongs to (None: a fixed n)."""
    for sw in cfg.sweeps:
        if sw.name in plan.sweeps and sw.precision is not None:
            return dict(sw.precision)
    return None


def target_met(rel_half_width: float, n_prompts: int, minimum: int, target: float) -> bool:
    """The stopping rule: at least ``minimum`` prompts and an interval within ``target`` of the estimate.

    The minimum guards the rule's coverage: stopping as soon as an interval looks narrow favours
    samples that are narrow by chance (simulated in tests/test_intervals.py: 0.92 at a minimum of
    5 prompts, 0.88 at 2).
    """
    return n_prompts >= minimum and rel_half_width == rel_half_width and rel_half_width <= target


def _records(layout: StudyLayout, ids: Iterable[str]) -> list[RequestRecord]:
    return [r for cid in ids if layout.is_done(cid) for r in layout.read_part(cid)]


def row_precision(layout: StudyLayout, spec_ids: Sequence[str], base_ids: Sequence[str]) -> tuple[float, int]:
    """(relative half-width of the paired speedup interval, distinct prompts) over a row's cells on disk."""
    sp = metrics.paired_speedup(_records(layout, base_ids), _records(layout, spec_ids))
    return intervals.relative_half_width(sp["speedup"], (sp["ci_low"], sp["ci_high"])), int(sp["n_prompts"])


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


def extensions(
    cfg: StudyConfig, plans: Sequence[CellPlan], layout: StudyLayout
) -> tuple[list[CellPlan], list[CellPlan]]:
    """(the extension cells on disk, the ones the rows short of their target need next, baselines first)."""
    out: dict[str, CellPlan] = {}
    done: dict[str, CellPlan] = {}
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
        if pending is None:
            continue  # the cap: max_prompts reached
        half, n = row_precision(layout, spec_ids, base_ids)
        if target_met(half, n, root.prompts, target["rel_half_width"]):
            continue
        for p in pending:
            if not layout.is_done(p.cell_id):
                out.setdefault(p.cell_id, p)
    loaded = plans[-1].backend_key() if plans else None  # extensions on the loaded engine run first
    order = sorted(out.values(), key=lambda p: (p.backend_key() != loaded, str(p.backend_key()), not p.is_baseline))
    return list(done.values()), order
