"""The capacity search's stopping rule in the runner: a probe above its repeat's first break is not run.

``specstudy run --refine-capacity`` searches for the highest rate meeting the study's SLO
(:mod:`specstudy.analysis.capacity`).  Its cells run rate by rate, lowest first, per (engine, method,
task, γ, batch, repeat); once one of them broke the SLO, the capacity of that repeat is settled from
above, and the probes above it (the grid's higher rates, a midpoint past the break, a lengthened probe
at such a rate) would cost their minutes and change nothing the report states.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..analysis.capacity import broke_below, probe_held
from ..config.schema import Slo
from ..layout import StudyLayout
from .plan import CellPlan


def _search_group(p: CellPlan) -> tuple[Any, ...]:
    """What one capacity search varies nothing but the rate (and a probe's length) within."""
    c = p.cell
    return (c.framework, p.target, p.drafter_id, p.label, c.method, c.gamma, c.task, c.batch_size, p.prefix_cache,
            c.repeat, p.sampling, p.arrivals)  # fmt: skip


def break_below(slo: Slo, plan: CellPlan, plans: Sequence[CellPlan], layout: StudyLayout) -> float | None:
    """The rate below ``plan``'s at which a finished probe of its search broke the SLO (each rate read from
    its longest finished probe, as the capacity reads it); None: none did, or ``plan`` is no Poisson probe."""
    if plan.request_rate is None or plan.arrivals != "poisson":
        return None
    group = _search_group(plan)
    longest: dict[float, CellPlan] = {}
    for p in plans:
        rate = p.request_rate
        if rate is None or rate >= plan.request_rate or _search_group(p) != group or not layout.is_done(p.cell_id):
            continue
        if rate not in longest or p.prompts > longest[rate].prompts:
            longest[rate] = p
    held = {rate: probe_held(layout.read_part(p.cell_id), slo) for rate, p in longest.items()}
    return broke_below(plan.request_rate, held)
