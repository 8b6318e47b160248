"""The capacity search's stopping rules in the runner: a repeat runs only the probes that can move its bracket.

``specstudy run --refine-capacity`` searches for the highest rate meeting the study's SLO
(:mod:`specstudy.analysis.capacity`).  Its cells run per (engine, method, task, γ, batch, repeat) in
bisection order (:func:`bisection_order`: the middle rate first, then the middles of the halves), so a
grid of n rates costs a repeat about log2(n) + 1 probes, not every rate up to its first break.  A round's
sweeps are the union of what every repeat needs (a midpoint for one repeat, a longer probe at a rate for
another), so each repeat skips what cannot change its own capacity:
a probe above its first break (the capacity reads nothing past it), one below a rate it already held
(the higher rate held too; where its queue was growing, the refinement reruns it longer first, and a
rate below runs only if that longer probe breaks), and a longer rerun of a probe that was conclusive (it
broke, or its queue was steady).  Each would cost its minutes
and change nothing the report states.

A probe itself stops once its verdict is decided (:func:`cut_rule`): when enough of its requests are past
a limit (TTFT or E2E from arrival; TPOT where every request decodes the same count) that the percentile is
broken whatever the rest do, its requests in flight are cancelled and the rest never sent.  A probe that
breaks costs until it broke, not its full length; one that holds runs to its end.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..analysis.capacity import bracket, broke_below, probe_held, stationary
from ..backends.loadgen import CutRule
from ..config.schema import Slo
from ..layout import StudyLayout
from .plan import CellPlan


def cut_rule(slo: Slo, n: int, tokens: int | None = None) -> CutRule | None:
    """When a probe of ``n`` requests has broken ``slo`` whatever its other requests do.  Its verdict
    (:func:`~specstudy.analysis.capacity.probe_held`) reads the q-th percentile of n latencies by linear
    interpolation, which is at least the value of rank ⌊q·(n−1)⌋ (from 0, ascending): once
    n − ⌊q·(n−1)⌋ requests are past a limit, that value is too (p90 of 12: 3 requests; of 24: 4).
    The requests then cut count as failed, as in the verdict, which stays broken.  TPOT is watched
    only where every request decodes ``tokens`` new tokens (``ignore_eos``): else a request's TPOT is
    known only at its end.  None: no limit to watch."""
    tpot = slo.tpot_s if tokens and tokens > 1 else None
    if n < 1 or (slo.ttft_s is None and slo.e2e_s is None and tpot is None):
        return None
    return CutRule(
        n - math.floor(slo.percentile / 100 * (n - 1)), slo.ttft_s, tpot, slo.e2e_s, tokens if tpot else None
    )


def _search_group(p: CellPlan) -> tuple[Any, ...]:
    """What one capacity search varies nothing but the rate (and a probe's length) within."""
    c = p.cell
    return (c.framework, p.target, p.drafter_id, p.label, c.method, c.gamma, c.task, c.batch_size, p.prefix_cache,
            c.repeat, p.sampling, p.arrivals)  # fmt: skip


def _bisection_ranks(n: int) -> list[int]:
    """Each of n sorted rates' place in the breadth-first order of a balanced search tree over them
    (the upper middle first): every rate comes after the rates whose verdicts lead a bisection to it."""
    ranks, queue, k = [0] * n, [(0, n - 1)], 0
    while queue:
        lo, hi = queue.pop(0)
        if lo > hi:
            continue
        mid = (lo + hi + 1) // 2
        ranks[mid], k = k, k + 1
        queue += [(lo, mid - 1), (mid + 1, hi)]
    return ranks


def bisection_order(plans: Sequence[CellPlan]) -> list[CellPlan]:
    """``plans`` with each search's Poisson probes reordered in its own places: its longer reruns first
    (their verdicts decide whether any rate below them is needed), then its shortest probes, each group by
    rate in bisection order; everything else where it was.

    The skip rules of :func:`why_not_probed` then make the order a bisection: once the middle rate holds,
    every rate below it is skipped; once it breaks, every rate above it.  A search runs only the rates on
    its path (2-3 probes of a 5-rate grid, 4 of 13)."""
    places: dict[tuple[Any, ...], list[int]] = {}
    for i, p in enumerate(plans):
        if p.request_rate is not None and p.arrivals == "poisson":
            places.setdefault(_search_group(p), []).append(i)
    out = list(plans)
    for idx in places.values():
        rates = sorted({float(plans[i].request_rate or 0.0) for i in idx})
        rank = dict(zip(rates, _bisection_ranks(len(rates))))
        shortest = min(plans[i].prompts for i in idx)
        ordered = sorted(
            (plans[i] for i in idx),
            key=lambda p: (p.prompts == shortest, rank[float(p.request_rate or 0.0)], p.prompts),
        )
        for i, p in zip(idx, ordered):
            out[i] = p
    return out


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
    # a rate above held: the capacity is at least that, whatever this one does.  One that held with its queue
    # growing settles it too: the refinement reruns that probe longer before any rate below it
    # (:func:`bisection_order`), and only if the longer probe breaks is this one needed (it then reads broke)
    settled = [r for r in held if rate < r <= cap and held[r]]
    if settled:
        steady = "a steady queue" if stationary(records[max(settled)]) is not False else "its queue growing"
        return f"not probed: its search held the SLO at {max(settled):g} req/s with {steady}"
    shorter = done.get(rate)
    if shorter is not None and shorter.prompts < plan.prompts:
        if held[rate] is False:
            return f"not rerun longer: its {shorter.prompts}-request probe broke the SLO"
        if stationary(records[rate]) is not False:
            return f"not rerun longer: its {shorter.prompts}-request probe was steady"
    return None
