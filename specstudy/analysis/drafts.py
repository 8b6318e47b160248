"""Measured draft lengths for the cost model: how often a row drafted, how much, and at what cost per k.

Leviathan's formula assumes γ tokens drafted every step.  Prompt lookup drafts only on a match,
and often fewer than γ tokens, so the cost model predicts from what the records counted
(:class:`costmodel.DraftMix`: the per-position counts of :mod:`specstudy.records` and each timed
step's cost by the number of tokens it drafted).  This module builds that mix, bounds the γ a
prediction may search (what the drafter can draft, what was measured), and says per row which of
the model's assumptions the measurement does not support.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np

from .. import costmodel, metrics
from ..records import RequestRecord
from .stats import NAN, Pooled, _step_times, isnum, pooled, predicted_for
from .study_records import Study

#: the measured/predicted band inside which a row needs no explanation
BAND = (0.9, 1.1)
#: fewer draft steps than this make the measured distribution noisy
FEW_DRAFT_STEPS = 30


def draft_mix(
    pairs: Iterable[tuple[Sequence[RequestRecord], Sequence[RequestRecord]]], block: bool = False
) -> costmodel.DraftMix | None:
    """The draft mix of (speculative, paired AR baseline) record sets, pooled.

    Counts come from each ok record's own counters (``target_forwards`` less the prompt pass,
    ``drafts_per_position``, ``accepted_per_position``); costs from its timed decode steps in units
    of its baseline's mean decode step T1 (as :func:`stats.step_costs`: with llama.cpp's whole-step
    times c is 0 and a step's drafting is inside its verification cost; ``block``: c per draft
    forward, one per step, as :func:`stats.step_costs`).  None without counters.
    """
    n, gamma, counted = 0, 0, []
    by_k: dict[int, list[float]] = {}
    no_draft: list[float] = []
    draft_s = drafted = 0.0
    whole_only = True
    for spec, base in pairs:
        recs = [
            r for r in spec if r.status == "ok" and r.target_forwards and r.drafts_per_position is not None and r.gamma
        ]
        for r in recs:
            n += int(r.target_forwards or 0) - 1
            gamma = max(gamma, int(r.gamma or 0))
            counted.append(metrics.Counters.of(r))
        t1 = [t for b in base if b.status == "ok" for _, t in _step_times(b)[0]]
        if not t1 or float(np.mean(t1)) <= 0:
            continue
        T1 = float(np.mean(t1))
        for r in recs:
            timed, whole = _step_times(r)
            whole_only &= whole or not timed
            for st, t in timed:
                extra = 0.0 if whole or st.draft_s is None else st.draft_s
                if st.drafted == 0:
                    no_draft.append((t + extra) / T1)
                    continue
                by_k.setdefault(st.drafted, []).append(t / T1)
                if not whole and st.draft_s is not None:
                    draft_s, drafted = draft_s + st.draft_s / T1, drafted + (1 if block else st.drafted)
    if n < 1 or gamma < 1:
        return None
    tot = metrics.Counters.pooled(counted)
    dge, age = [d for d in tot.drafts_per_position if d], [a for a in tot.accepted_per_position if a]
    c = 0.0 if by_k and whole_only else (draft_s / drafted if drafted else NAN)
    try:
        return costmodel.DraftMix(
            decode_steps=n,
            drafted_ge=tuple(dge),
            accepted_ge=tuple(age),
            gamma=max(gamma, len(dge)),
            c=c,
            verify_by_k={k: float(np.mean(v)) for k, v in sorted(by_k.items())},
            no_draft=float(np.mean(no_draft)) if no_draft else NAN,
            block=block,
        )
    except ValueError:  # counters that contradict each other (a backend's bug): no mix rather than a wrong one
        return None


def model_checks(pairs: Iterable[tuple[Sequence[RequestRecord], Sequence[RequestRecord]]]) -> dict[str, float]:
    """What the cost model takes as given, measured: the speculative prompt pass relative to AR's
    (Σ TTFT of paired requests; the model takes 1, or 1 + c with a separate draft) and the share of
    decode wall time outside the timed steps (speculative and AR; the model takes them as equal)."""
    ttft = [0.0, 0.0]
    wall = {"spec": [0.0, 0.0], "ar": [0.0, 0.0]}  # (Σ untimed, Σ decode wall)
    for spec, base in pairs:
        by_key = {(b.prompt_id, b.repeat): b for b in base if b.status == "ok" and b.first_token_s is not None}
        for r in spec:
            b = by_key.get((r.prompt_id, r.repeat))
            if r.status == "ok" and r.first_token_s is not None and b is not None:
                ttft[0] += r.first_token_s
                ttft[1] += float(b.first_token_s or 0.0)
        for side, recs in (("spec", spec), ("ar", base)):
            for r in recs:
                timed = _step_times(r)[0] if r.status == "ok" else []
                if timed and r.end_s is not None and r.first_token_s is not None and r.end_s > r.first_token_s:
                    w = r.end_s - r.first_token_s
                    wall[side][0] += w - sum(t for _, t in timed)
                    wall[side][1] += w
    out: dict[str, float] = {}
    if ttft[1] > 0:
        out["prompt_pass_ratio"] = ttft[0] / ttft[1]
    for side, (u, w) in wall.items():
        if w > 0:
            out[f"untimed_{side}"] = u / w
    return out


def with_draft_mix(p: Pooled, data: Study, cell_ids: Iterable[str]) -> Pooled:
    """``p`` (pooled from ``cell_ids``) with its measured draft mix and model checks set."""
    pairs = [(data.records.get(c, []), data.baseline(c)) for c in cell_ids]
    p.cost.draft_mix = draft_mix(pairs, p.sample.block)
    p.cost.model_checks = model_checks(pairs)
    return p


def _with_mix(p: Pooled, mix: costmodel.DraftMix) -> Pooled:
    """A copy of ``p`` whose cost part holds ``mix``."""
    return replace(p, cost=replace(p.cost, draft_mix=mix))


def pooled_drafts(data: Study, cell_ids: Iterable[str]) -> Pooled:
    """:func:`stats.pooled` of ``cell_ids`` with the measured draft mix the cost model predicts from."""
    cell_ids = list(cell_ids)
    return with_draft_mix(pooled(data, cell_ids), data, cell_ids)


#: why a prediction's γ search stops where it does (:mod:`specstudy.report.model_notes` words each);
#: ``uncounted_<limit>``: draft lengths not counted, γ drafted every step assumed, searched to ``<limit>``
SEARCH_LIMITS = (
    "measured_depth",
    "heads",
    "search_limit",
    "gamma_values_uncounted",
    "uncounted_heads",
    "uncounted_search_limit",
    "uncounted_gamma_values",
)


@lru_cache(maxsize=64)
def draft_cap(method: str, drafter: str | None) -> tuple[int | None, str]:
    """The most tokens ``method``'s drafter can propose in one step, and why (a :data:`SEARCH_LIMITS`
    key); (None, "") when unbounded.

    Medusa-style heads draft one token per head (the reference engine refuses γ > heads).  EAGLE's
    layer, a draft model, early exit, trees and n-gram lookup draft any length.
    """
    if method == "heads" and drafter:
        try:
            from ..engine.drafters import drafter_file_metadata  # lazy: torch, only for heads rows

            k = int(drafter_file_metadata(drafter, "heads")["num_heads"])
        except (ValueError, OSError, KeyError, ImportError):
            return None, ""
        return k, "heads"
    return None, ""


def search_cap(
    mixes: Sequence[costmodel.DraftMix], method: str, drafter: str | None, extrapolate: bool, max_gamma: int = 16
) -> tuple[int, int, str]:
    """(largest γ a prediction searches, the measured draft depth, why that limit: a :data:`SEARCH_LIMITS` key).

    The measured depth (α̂ is not carried past it), or with ``extrapolate`` the drafter's own cap
    (``max_gamma`` when it has none); never past what the drafter can draft.
    """
    cap, why = draft_cap(method, drafter)
    depth = max((m.gamma for m in mixes), default=0)
    if depth and not extrapolate and (cap is None or depth <= cap):
        return depth, depth, "measured_depth"
    if cap is not None:
        return cap, depth, why
    return max_gamma, depth, "search_limit"


def mix_at(mixes: dict[int, costmodel.DraftMix], gamma: int) -> tuple[int, costmodel.DraftMix] | None:
    """The measured mix that predicts γ: the one run at the smallest γ ≥ ``gamma`` (its drafts cut to γ),
    else the deepest (extrapolated)."""
    if not mixes:
        return None
    at = min((g for g in mixes if g >= gamma), default=max(mixes))
    return at, mixes[at]


def optimal_measured(
    data: Study, by_gamma: dict[int, list[str]], extrapolate: bool = False, per_g: dict[int, Pooled] | None = None
) -> dict[str, Any] | None:
    """The cost model's best γ for one method from its measured cells, with their own step costs.

    Each γ is predicted from the mix measured at the nearest γ run at or above it (:func:`mix_at`),
    with c and the verification costs per k pooled over every γ run; the search stops at
    :func:`search_cap`.  Returns {gamma, speedup (request level), max_gamma, depth, why,
    extrapolated}, or None when nothing was measured to predict from.  ``per_g``: the rows of
    :func:`pooled_drafts` per γ when the caller has them already.
    """
    cells = [c for cs in by_gamma.values() for c in cs]
    if per_g is None:
        per_g = {g: pooled_drafts(data, cs) for g, cs in by_gamma.items()}
    per_g = {g: p for g, p in per_g.items() if g}
    if not per_g:
        return None
    allp = pooled_drafts(data, cells)
    mixes = {g: p.cost.draft_mix for g, p in per_g.items() if p.cost.draft_mix is not None}
    meta = data.meta(cells[0])
    if mixes:
        cap, depth, why = search_cap(list(mixes.values()), meta["method"], meta["drafter"], extrapolate)

        def at(g: int) -> float:
            found = mix_at(mixes, g)
            if found is None:
                return NAN
            return predicted_for(_with_mix(per_g[found[0]], _with_costs(found[1], allp.cost.draft_mix)), g)

    else:  # no counters: Leviathan's γ every step, searched to the γ values run
        if not (isnum(allp.acceptance.alpha_hat) and isnum(allp.cost.c) and isnum(allp.cost.verify_ratio)):
            return None
        heads = draft_cap(meta["method"], meta["drafter"])[0]
        depth = max(per_g)
        cap, why = min(depth, heads or depth), "gamma_values_uncounted"

        def at(g: int) -> float:
            return predicted_for(allp, g)

    g, s = costmodel.best_gamma(lambda g: v if isnum(v := at(g)) else -np.inf, cap)
    if not np.isfinite(s):
        return None
    return {"gamma": g, "speedup": s, "max_gamma": cap, "depth": depth, "why": why, "extrapolated": g > depth}


def _with_costs(mix: costmodel.DraftMix, costs: costmodel.DraftMix | None) -> costmodel.DraftMix:
    """``mix`` with the step costs of ``costs`` (pooled over more cells: more k measured)."""
    if costs is None:
        return mix
    return replace(mix, c=costs.c, verify_by_k=costs.verify_by_k, no_draft=costs.no_draft)


@dataclass(frozen=True)
class Bend:
    """One of the cost model's assumptions a row's measurement bends, with the numbers that show it
    (:mod:`specstudy.report.model_notes` words it).  ``kind`` is one of :data:`BENDS`."""

    kind: str
    values: tuple[float, ...] = ()


#: what a :class:`Bend` can say, and the numbers it carries
BENDS = {
    "not_counted": "draft lengths not counted: γ every step assumed",
    "no_step_drafted": "no step drafted",
    "drafts_vary": "(share of steps that draft, mean tokens drafted)",
    "extrapolated": "(the measured depth α̂ is carried past)",
    "few_draft_steps": "(draft steps)",
    "verify_one_mean": "verification cost not timed per k",
    "verify_missing": "(the k values not timed)",
    "no_draft_cost": "(a step without a draft's cost, in T1)",
    "prompt_pass": "(prompt pass / AR's, the model's ratio)",
    "untimed": "(decode share outside timed steps, AR's)",
    "no_draft_untimed": "steps without a draft not timed",
    "outside_band": "(the band's low and high ends)",
}


def model_bends(p: Pooled, gamma: int | None, measured_over_predicted: float = NAN) -> tuple[Bend, ...]:
    """Which of the cost model's assumptions a row's measurement bends (none: empty)."""
    if p.sample.synthetic is not None or not gamma:
        return ()
    mix, notes = p.cost.draft_mix, []
    if mix is None:
        notes.append(Bend("not_counted"))
    else:
        k = mix.steps_drafting(min(int(gamma), mix.gamma))
        mean_k = sum(kk * n for kk, n in k.items()) / mix.draft_steps if mix.draft_steps else 0.0
        if not mix.draft_steps:
            notes.append(Bend("no_step_drafted"))
        elif mix.draft_share < 0.99 or mean_k < min(int(gamma), mix.gamma) - 0.01:
            notes.append(Bend("drafts_vary", (mix.draft_share, mean_k)))
        if int(gamma) > mix.gamma:
            notes.append(Bend("extrapolated", (mix.gamma,)))
        if 0 < mix.draft_steps < FEW_DRAFT_STEPS:
            notes.append(Bend("few_draft_steps", (mix.draft_steps,)))
        if not mix.verify_by_k:
            if isnum(p.cost.verify_ratio):
                notes.append(Bend("verify_one_mean"))
        elif missing := sorted(set(k) - set(mix.verify_by_k)):
            notes.append(Bend("verify_missing", tuple(missing)))
        if isnum(mix.no_draft) and abs(mix.no_draft - 1.0) > 0.1 and mix.draft_share < 0.99:
            notes.append(Bend("no_draft_cost", (mix.no_draft,)))
    if isnum(measured_over_predicted) and not BAND[0] <= measured_over_predicted <= BAND[1]:
        notes += _why_off(p)
    return tuple(notes)


def _why_off(p: Pooled) -> list[Bend]:
    """Measured departures from what the model takes as given, for a row outside :data:`BAND`."""
    ch, out = p.cost.model_checks, []
    want = 1.0 + (p.cost.c if p.sample.separate_draft and isnum(p.cost.c) else 0.0)
    r = ch.get("prompt_pass_ratio", NAN)
    if isnum(r) and abs(r / want - 1.0) > 0.1:
        out.append(Bend("prompt_pass", (r, want)))
    us, ua = ch.get("untimed_spec", NAN), ch.get("untimed_ar", NAN)
    if isnum(us) and isnum(ua) and abs(us - ua) > 0.05:
        out.append(Bend("untimed", (us, ua)))
    if p.cost.draft_mix is not None and not isnum(p.cost.draft_mix.no_draft) and p.cost.draft_mix.draft_share < 0.99:
        out.append(Bend("no_draft_untimed"))
    return out or [Bend("outside_band", BAND)]
