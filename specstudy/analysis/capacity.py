"""Capacity under an SLO: the highest offered request rate at which a server still meets it.

A request-rate sweep says how latency grows with load; a deployment needs the rate it can take.
Per (engine, method, task, γ) and repeat, the capacity is the highest swept rate below which the
SLO held at every rate (:func:`specstudy.metrics.slo_holds`, the study's percentile, TTFT and E2E
from each request's arrival: a request that waited for one of the cell's slots waited as a user
would, and a probe whose queue grew at the client is judged by it, not hidden); the first
rate where it broke bounds it from above.  :func:`refine_rates` proposes the rates that narrow
those brackets (geometric bisection) and extend a grid that missed the capacity (one step of the grid
below a repeat that broke at its lowest rate, or straight down to the rate this machine served in that
probe where that is lower: :func:`served_rate`; one step above a repeat that never broke), which
``specstudy run --refine-capacity`` measures; the same
rounds rerun the rates at which a probe held the SLO without being stationary (:func:`stationary`; a
probe that broke with its queue growing is over capacity, and its break stands) with twice its prompts,
at most :data:`LONGEST_PROBE_GROWTH` times its configured count, for that framework's methods and
repeats (:func:`unsteady_rates`), and the longest probe of a rate counts.  Each repeat runs only the
probes that can move its own bracket (``specstudy.run.capacity_search``): none above its first break
(:func:`broke_below`), none below a rate it held (a longer rerun of a held probe whose queue grew runs
first, and a rate below only if it breaks), and no longer rerun of a probe that was conclusive.

Where a repeat never broke up to the highest rate probed, its capacity is only bounded from below and
the group's capacity is that lower bound (the least such rate), with no interval; where a repeat broke
at every rate probed, it is below the lowest (0, no interval).  Otherwise, over repeats the capacity is
the geometric mean of the per-repeat capacities with a t-interval on the log scale
(:func:`specstudy.intervals.log_mean_ci`: a rate is positive, and both bounds stay so), the repeat being
the unit: a rate is not a prompt, so no
interval over prompts applies, and each repeat is a whole independent search (its probes share
nothing with another repeat's).  What the interval covers is the capacity this search finds on
average (on its rate grid, refined to its resolution), not the SLO's exact crossing, which the
grid bounds from below by at most one bracket.  Below ``MIN_PROMPTS_FOR_CI`` repeats there is no
interval (the same floor as the prompt intervals'): tests/analysis/test_capacity_interval.py
simulates the search with a known truth (the geometric mean of the capacities it finds): 95 % intervals
over 5 repeats cover it near 0.95.  Speculation's
capacity stands beside its AR's.  Pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..config.schema import Slo
from ..intervals import MIN_PROMPTS_FOR_CI, log_mean_ci
from ..metrics import e2e, prompt_of, queued, slo_holds, ttft
from ..records import RequestRecord, cut_short
from .rates import study_slo
from .study_records import Study

#: what makes one capacity: a rate means nothing without the workload (task, output length) and the engine
_GROUP = ("framework", "label", "method", "task", "max_new_tokens", "gamma", "prefix_cache", "sampling")


#: a probe whose last third of requests waited this many times longer for a first token than its first
#: third had a queue still growing: not stationary (its percentiles depend on how long it ran)
GROWING_QUEUE = 2.0


def stationary(records: Sequence[RequestRecord]) -> bool | None:
    """Whether a probe reached a steady state: its arrivals spanned at least its median request's latency
    from arrival (else it was a burst that a batching server takes in one go: the make study-deploy of
    2026-12-05 19:35 had vLLM hold the SLO with 12 requests sent at 16 req/s, 0.7 s of arrivals against
    4 s requests, and break it with 24), and the median time from arrival to first token (the wait for a
    slot included) of its last third of requests (by send time) stayed within :data:`GROWING_QUEUE` times
    its first third's (None: fewer than 6 ok requests)."""
    ok = sorted((r for r in records if r.status == "ok"), key=lambda r: r.start_epoch)
    if len(ok) < 6:
        return None
    arrivals = [r.start_epoch - queued(r) for r in ok]
    if max(arrivals) - min(arrivals) < float(np.median([e2e(r) + queued(r) for r in ok])):
        return False
    third = len(ok) // 3
    first, last = (float(np.median([ttft(r) + queued(r) for r in part])) for part in (ok[:third], ok[-third:]))
    return bool(last <= GROWING_QUEUE * first)


#: a probe that is not stationary is rerun longer (twice its prompts per round of the capacity search),
#: up to this many times its sweep's configured prompts: beyond, it stays flagged
LONGEST_PROBE_GROWTH = 4


def probe_held(records: Sequence[RequestRecord], slo: Slo) -> bool | None:
    """Whether one probe met the SLO, TTFT and E2E counted from each request's arrival (None: no requests)."""
    return slo_holds(records, slo.ttft_s, slo.tpot_s, slo.e2e_s, slo.percentile, from_arrival=True)


def served_rate(records: Sequence[RequestRecord]) -> float:
    """Requests the server completed per second over a probe (first send to last completion): at an
    offered rate above its capacity, what this machine serves, whatever rate the grid guessed."""
    ok = [r for r in records if r.status == "ok" and r.end_s is not None and r.start_epoch]
    if len(ok) < 2:
        return math.nan
    t0, t1 = min(r.start_epoch for r in ok), max(r.start_epoch + (r.end_s or 0.0) for r in ok)
    return len(ok) / (t1 - t0) if t1 > t0 else math.nan


def probes(study: Study, slo: Slo | None = None) -> pd.DataFrame:
    """One row per request-rate cell: its group, repeat, rate, prompts, sweeps, whether the SLO held and
    whether the probe was stationary."""
    slo = slo or study_slo(study)
    rows = []
    for cid, m in study.cells.items():
        if m["request_rate"] is None or m.get("arrivals", "poisson") != "poisson":
            continue
        held = probe_held(study.records[cid], slo)
        rows.append(
            {
                **{k: m[k] for k in _GROUP},
                "repeat": m["repeat"],
                "rate": float(m["request_rate"]),
                "prompts": len({prompt_of(r) for r in study.records[cid]}),
                "held": held,
                "stationary": stationary(study.records[cid]),
                "served_rps": served_rate(study.records[cid]),
                "cut": cut_short(study.records[cid]),
                "sweeps": tuple(m["sweeps"]),
                "cell_id": cid,
            }
        )
    return pd.DataFrame(rows)


def longest(pr: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Each (group, repeat, rate)'s longest probe (a lengthened probe replaces the shorter one it reran),
    and how many shorter probes it replaced."""
    if pr.empty:
        return pr, 0
    keys = list(_GROUP) + ["repeat", "rate"]
    kept = pr.sort_values("prompts").groupby(keys, dropna=False, sort=False).tail(1)
    return kept, len(pr) - len(kept)


def _doubtful(pr: pd.DataFrame) -> pd.Series:
    """Probes whose SLO held while their queue still grew: run longer they might break.  A probe that
    broke with a growing queue is over capacity (longer, its queue only grows) and its break stands."""
    return (pr["stationary"] == False) & (pr["held"] == True)  # noqa: E712 (None: unknown)


def unsteady_rates(study: Study, slo: Slo | None = None) -> dict[tuple[str, str], tuple[tuple[float, ...], int]]:
    """Per (sweep, framework), the rates at which a probe held the SLO without being stationary (still its
    rate's longest) at its repeat's capacity, and the prompts of the longest such probe: what the search
    reruns longer (above a repeat's break the runner probes nothing), every
    method and repeat of that framework at those rates (the repeats of a rate stay alike, and AR's
    probe stays the same length as speculation's), instead of the whole sweep."""
    pr, _ = longest(probes(study, slo))
    found: dict[tuple[str, str], tuple[set[float], int]] = {}
    if pr.empty:
        return {}
    deciding = _at_capacity(pr)
    for _, row in pr[_doubtful(pr) & deciding].iterrows():
        for sweep in row["sweeps"]:
            rates, most = found.get((sweep, row["framework"]), (set(), 0))
            found[(sweep, row["framework"])] = (rates | {float(row["rate"])}, max(most, int(row["prompts"])))
    return {k: (tuple(sorted(rates)), most) for k, (rates, most) in found.items()}


def _at_capacity(pr: pd.DataFrame) -> pd.Series:
    """The probes at their repeat's capacity (the highest rate held below the first break): the ones whose
    verdict decides it.  A held probe below it whose queue grew is not rerun: the higher rate held too."""
    out = pd.Series(False, index=pr.index)
    for g, (cap, _) in _repeat_brackets(pr):
        out[g.index] = g["rate"] == cap
    return out


def _repeat_brackets(pr: pd.DataFrame) -> Iterator[tuple[pd.DataFrame, tuple[float, float]]]:
    """Each (group, repeat)'s probes with its :func:`bracket` (capacity, first break)."""
    for _, g in pr.groupby(list(_GROUP) + ["repeat"], dropna=False):
        yield g, bracket(dict(zip(g["rate"], g["held"])))


def bracket(held_by_rate: Mapping[float, bool | None]) -> tuple[float, float]:
    """(capacity, first breaking rate): the highest rate below the first break, and that break
    (inf when it never broke; capacity 0 when it broke at the lowest rate)."""
    cap, broke = 0.0, math.inf
    for rate in sorted(held_by_rate):
        if held_by_rate[rate] is None:
            continue
        if not held_by_rate[rate]:
            broke = rate
            break
        cap = rate
    return cap, broke


def broke_below(rate: float, held_by_rate: Mapping[float, bool | None]) -> float | None:
    """The first rate below ``rate`` at which a repeat's probes broke the SLO (None: none did).  A search
    does not probe above it: :func:`bracket` reads nothing past the first break (as vLLM's SLA search
    stops at its first failing rate), so such a probe would cost its minutes and change no capacity."""
    _, broke = bracket({r: h for r, h in held_by_rate.items() if r < rate})
    return None if math.isinf(broke) else broke


def repeat_interval(caps: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """Capacity over repeats, the geometric mean, and its interval on the log scale (a rate is positive:
    :func:`~specstudy.intervals.log_mean_ci`); NaN bounds below ``MIN_PROMPTS_FOR_CI`` repeats.  A repeat
    that never broke bounds the capacity from below (inf, no interval); one that never held, from above
    (0: below the lowest rate probed, no interval)."""
    if any(math.isinf(c) for c in caps):
        return (math.inf, math.nan, math.nan)
    if any(c <= 0 for c in caps):
        return (0.0, math.nan, math.nan)
    return log_mean_ci(list(caps), level=level, min_n=MIN_PROMPTS_FOR_CI)


def capacity_frame(study: Study, slo: Slo | None = None) -> pd.DataFrame:
    """Per group: capacity per repeat, its mean, interval and range, the break above it, the rates probed,
    and its probes still not stationary and those replaced by a longer rerun."""
    every = probes(study, slo)
    pr, _ = longest(every)
    if pr.empty:
        return pr
    rows = []
    for key, g in pr.groupby(list(_GROUP), dropna=False, sort=True):
        caps, breaks = [], []
        for _, rg in g.groupby("repeat"):
            cap, broke = bracket(dict(zip(rg["rate"], rg["held"])))
            caps.append(cap)
            breaks.append(broke)
        # a repeat that never broke only bounds its capacity from below, one that never held from above
        unbroken = sum(math.isinf(b) for b in breaks)
        never_held = sum(c <= 0 for c in caps)
        if unbroken or never_held:
            estimate = (min(caps) if unbroken else 0.0, math.nan, math.nan)
        else:
            estimate = repeat_interval(caps)
        rows.append(
            {
                **dict(zip(_GROUP, key)),
                "repeats": len(caps),
                "repeats_never_broke": unbroken,
                "repeats_never_held": never_held,
                **dict(zip(("capacity_rps", "capacity_ci_low", "capacity_ci_high"), estimate)),
                "capacity_min_rps": min(caps),
                "capacity_max_rps": max(caps),
                "breaks_at_rps": float(np.median(breaks)),
                # the widest repeat's bracket (first break / capacity): what the search's resolution reached
                "widest_bracket": max((b / c for b, c in zip(breaks, caps) if c > 0), default=math.inf),
                "unsteady_probes": int(_doubtful(g).sum()),
                "lengthened_probes": _replaced(every, key),
                "cut_probes": int(g["cut"].sum()) if "cut" in g else 0,
                "rates": sorted(set(g["rate"])),
            }
        )
    return pd.DataFrame(rows)


def _replaced(every: pd.DataFrame, key: tuple[Any, ...]) -> int:
    """How many of one group's probes a longer rerun replaced."""
    mask = pd.Series(True, index=every.index)
    for col, val in zip(_GROUP, key):
        mask &= every[col].isna() if val != val or val is None else every[col] == val
    return longest(every[mask])[1]


def beside_ar(frame: pd.DataFrame) -> pd.DataFrame:
    """Each speculative group with its engine's AR capacity on the same task and output length, and their ratio."""
    if frame.empty:
        return frame
    same = ["framework", "task", "max_new_tokens", "prefix_cache", "sampling"]
    ar = frame[frame["method"] == "ar"].set_index(same)
    spec = frame[frame["method"] != "ar"].copy()
    keys = list(zip(*(spec[c] for c in same)))
    spec["ar_capacity_rps"] = [ar["capacity_rps"].get(k, math.nan) for k in keys]
    # AR's capacity may itself be a bound (a repeat that never broke, or never held): said, never compared
    for col, empty in (("repeats_never_broke", 0), ("repeats_never_held", 0), ("rates", ())):
        spec[f"ar_{col}"] = [ar[col].get(k, empty) if col in ar else empty for k in keys]
    bounded = [bool(b or h) for b, h in zip(spec["ar_repeats_never_broke"], spec["ar_repeats_never_held"])]
    spec["capacity_ratio"] = [
        c / a if a and a == a and not bound else math.nan
        for c, a, bound in zip(spec["capacity_rps"], spec["ar_capacity_rps"], bounded)
    ]
    return spec


def next_rate(
    held_by_rate: Mapping[float, bool | None],
    step: float = 2.0,
    resolution: float = 1.2,
    served: float = math.nan,
) -> float | None:
    """The rate one repeat's search probes next (None: its bracket is narrow enough): the geometric midpoint of
    its bracket; when it broke at its lowest rate, one grid ``step`` below that or, lower still, the rate the
    machine served in that probe (``served``: :func:`served_rate`; a slow machine's capacity is found from
    what it measured, not stepped down to from a grid made elsewhere); when it never broke, one ``step``
    above its highest held rate.  A grid that missed the capacity is extended, not trusted."""
    cap, broke = bracket(held_by_rate)
    if cap <= 0 and not math.isinf(broke):
        below = broke / step
        return round(served if 0 < served < below else below, 3)
    if math.isinf(cap):
        return None
    if math.isinf(broke):
        return round(cap * step, 3)
    return round(math.sqrt(cap * broke), 3) if broke / cap > resolution else None


def _grid_step(rates: pd.Series) -> float:
    """The widest ratio between a group's consecutive finite probed rates (2 with fewer): the step its grid
    extends by.  Not its two lowest: a repeat that broke at its lowest rate steps down to the rate it
    served there, often only a few per cent lower (0.609 then 0.593 req/s on llama.cpp, 2026-12-07), and
    that ratio would become every later step."""
    finite = sorted({float(r) for r in rates if math.isfinite(r) and r > 0})
    return max((b / a for a, b in zip(finite, finite[1:])), default=2.0)


def refine_rates(
    study: Study, slo: Slo | None = None, resolution: float = 1.2, unbracketed_only: bool = False
) -> dict[str, list[float]]:
    """Per sweep, the next probe of every repeat's search (:func:`next_rate`): the rates that halve
    (geometrically) every bracket wider than ``resolution`` (the break over the capacity), and those that
    extend the grid by its own step where a repeat broke at its lowest rate or never broke, or where its
    capacity is its lowest rate from a probe held with its queue growing (rerun longer in the same round,
    it may break).  Empty when every bracket is narrow enough.  ``unbracketed_only``: only the repeats that
    never held or never broke (the follow-up rounds after the refinement: one probe each, not a round)."""
    pr, _ = longest(probes(study, slo))
    if pr.empty:
        return {}
    out: dict[str, set[float]] = {}
    for _, group in pr.groupby(list(_GROUP), dropna=False):
        step = _grid_step(group["rate"])
        for _, g in group.groupby("repeat"):
            held = dict(zip(g["rate"], g["held"]))
            cap, broke = bracket(held)
            if unbracketed_only and cap > 0 and not math.isinf(broke):
                continue
            lowest = g[g["rate"] == g["rate"].min()]
            rates = {next_rate(held, step, resolution, float(lowest["served_rps"].iloc[0]))}
            if not unbracketed_only and cap == g["rate"].min() and _doubtful(g[g["rate"] == cap]).any():
                rates.add(round(cap / step, 3))  # its longer rerun may break: the rate below is probed beside it
            for sweep in g["sweeps"].iloc[0]:
                out.setdefault(sweep, set()).update(r for r in rates if r is not None)
    return {s: sorted(v) for s, v in out.items()}
