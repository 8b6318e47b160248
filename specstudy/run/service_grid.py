"""A capacity search's first rates from this machine's measured service rate, not a profile's grid.

A sweep with ``rates_from_service: [f1, f2, ...]`` runs its closed-loop probe first (the sweep's
batch size, its prompts, rate-less: :func:`specstudy.run.plan.expand` keeps it in the plan).  Per
search (engine, method, task, γ, batch, sampling) the probe's served rate μ (requests completed per
second, :func:`specstudy.analysis.capacity.served_rate`, the median over repeats); the sweep's first
rates are f·μ at the median μ of its searches (:func:`first_rates`: one grid, since every rate of a
sweep is probed by every search, and AR and prompt lookup served 1.02 and 1.04 req/s here, which as
two grids made six rates where three do), each repeat skipping what cannot move its own bracket
(:mod:`specstudy.run.capacity_search`); ``--refine-capacity`` rounds then halve each bracket to
``RESOLUTION`` and extend a grid that missed a search's capacity.  A machine twice as fast gets rates twice as high from the same file.
The rates follow from records on disk, so a rerun finds the same ones (and the same cells).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from typing import Any

from ..analysis.capacity import served_rate
from ..config import StudyConfig
from ..layout import StudyLayout
from .plan import CellPlan, expand

#: the bracket width (first break / capacity) a refinement round stops at (the runner's --refine-capacity)
RESOLUTION = 1.2


def _signif(x: float, digits: int = 3) -> float:
    """A rate rounded to ``digits`` significant figures (cell ids stay readable, reruns equal)."""
    return round(x, digits - 1 - math.floor(math.log10(abs(x))))


def _search(p: CellPlan) -> tuple[Any, ...]:
    c = p.cell
    return (c.framework, p.target, p.drafter_id, p.label, c.method, c.gamma, c.task, c.batch_size, p.sampling)


def service_rates(plans: Sequence[CellPlan], layout: StudyLayout, sweep: str) -> dict[tuple[Any, ...], float]:
    """Per search of ``sweep``, the served rate of its finished closed-loop probes (median over repeats)."""
    served: dict[tuple[Any, ...], list[float]] = {}
    for p in plans:
        if sweep in p.sweeps and p.request_rate is None and layout.is_done(p.cell_id):
            mu = served_rate(layout.read_part(p.cell_id))
            if mu == mu and mu > 0:
                served.setdefault(_search(p), []).append(mu)
    return {k: statistics.median(v) for k, v in served.items()}


def first_rates(served: Sequence[float], factors: Sequence[float]) -> set[float]:
    """A sweep's first rates: each factor times the median of its searches' served rates."""
    mu = statistics.median(served)
    return {_signif(f * mu) for f in factors}


def with_service_rates(
    cfg: StudyConfig, layout: StudyLayout, plans: Sequence[CellPlan] | None = None
) -> tuple[StudyConfig, set[str]] | None:
    """The study with each ``rates_from_service`` sweep's first rates set from its probes on disk, and the
    sweeps that changed (None: no such sweep, or no probe finished); ``plans``: ``cfg``'s, when expanded."""
    if not any(sw.service_factors for sw in cfg.sweeps):
        return None
    plans = expand(cfg) if plans is None else plans
    changed: dict[str, tuple[float, ...]] = {}
    for sw in cfg.sweeps:
        if not sw.service_factors:
            continue
        mus = service_rates(plans, layout, sw.name)
        if not mus:
            continue
        rates = first_rates(list(mus.values()), sw.service_factors)
        if rates - set(sw.request_rates):
            changed[sw.name] = tuple(sorted(rates | set(sw.request_rates)))
            print(
                f"capacity search: {sw.name} measured {', '.join(f'{mu:.3g}' for mu in sorted(mus.values()))} req/s "
                f"served; first rates {list(changed[sw.name])}",
                flush=True,
            )
    if not changed:
        return None
    sweeps = tuple(dataclasses.replace(sw, request_rates=changed.get(sw.name, sw.request_rates)) for sw in cfg.sweeps)
    return dataclasses.replace(cfg, sweeps=sweeps), set(changed)
