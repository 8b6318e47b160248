"""The capacity search's stopping rules in the runner: a repeat runs only the probes that can move its bracket.

``specstudy run --refine-capacity`` searches for the highest rate meeting the study's SLO
(:mod:`specstudy.analysis.capacity`).  Its cells run rate by rate, lowest first, per (engine, method,
task, γ, batch, repeat).  A round's sweeps are the union of what every repeat needs (a midpoint for one
repeat, a longer probe at a rate for another), so each repeat skips what cannot change its own capacity:
a probe above its first break (the capacity reads nothing past it), one below a rate it already held
with a steady queue (the higher rate held too, and a longer probe would not overturn it), and a longer
rerun of a probe that was conclusive (it broke, or its queue was steady).  Each would cost its minutes
and change nothing the report states.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..analysis.capacity import bracket, broke_below, probe_held, stationary
from ..config.schema import Slo
from ..layout import StudyLayout
from .plan import CellPlan


def _search_group(p: CellPlan) -> tuple[Any, ...]:
    """What one capacity search varies nothing but the rate (and a probe's length) within."""
    c = p.cell
    return (c.framework, p.target, p.drafter_id, p.label, c.method, c.gamma, c.task, c.batch_size, p.prefix_cache,
            c.repeat, p.sampling, p.arrivals)  # fmt: skip


def _longest_finished(plan: CellPlan, plans: Sequence[CellPlan], layout: StudyLayout) -> dict[float, CellPlan]:
    """Per rate, the longest finished probe of ``plan``'s search (the one the capacity reads), ``plan`` aside."""
    group = _search_group(plan)
    out: dict[float, CellPlan] = {}
    for p in plans:
        rate = p.request_rate
        if rate is None or p.cell_id == plan.cell_id or _search_group(p) != group or not layout.is_done(p.cell_id):
            continue
        if rate not in out or p.prompts > out[rate].prompts:
            out[rate] = p
    return out


def why_not_probed(slo: Slo, plan: CellPlan, plans: Sequence[CellPlan], layout: StudyLayout) -> str | None:
    """Why ``plan`` cannot move its repeat's capacity, from that search's finished probes (None: run it,
    or ``plan`` is no Poisson probe)."""
    rate = plan.request_rate
    if rate is None or plan.arrivals != "poisson":
        return None
    done = _longest_finished(plan, plans, layout)
    records = {r: layout.read_part(p.cell_id) for r, p in done.items()}
    held = {r: probe_held(recs, slo) for r, recs in records.items()}
    if (broke := broke_below(rate, held)) is not None:
        return f"not probed: its search broke the SLO at {broke:g} req/s"
    cap, _ = bracket(held)
    settled = [r for r in held if rate < r <= cap and held[r] and stationary(records[r]) is not False]
    if settled:  # a rate above held with a steady queue: the capacity is at least that, whatever this one does
        return f"not probed: its search held the SLO at {max(settled):g} req/s with a steady queue"
    shorter = done.get(rate)
    if shorter is not None and shorter.prompts < plan.prompts:
        if held[rate] is False:
            return f"not rerun longer: its {shorter.prompts}-request probe broke the SLO"
        if stationary(records[rate]) is not False:
            return f"not rerun longer: its {shorter.prompts}-request probe was steady"
    return None
