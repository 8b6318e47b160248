"""Predictions for another machine from a finished study's measured acceptance and draft lengths.

Acceptance and how often and how much a method drafts depend on the model pair, the task and the
sampling, not on the hardware; step costs depend on the hardware.  So the measured draft mix
(:mod:`specstudy.analysis.drafts`: share of steps that draft, draft lengths, per-position
acceptance) and α̂ of each (framework, method, task, sampling) of one study, with a profile's
roofline step costs (or the study's own measured costs), predict the seed-shaped table for that
profile: baseline and speculative tokens/s, the optimal γ, the speedup and the break-even batch.
The optimal γ stays within the depth measured and what the drafter can draft unless asked to
extrapolate, and then says so.  Every row says it is a prediction and where its costs came from.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from .. import costmodel
from ..config.vocab import cost_dtype
from ..costmodel import HardwareProfile
from .drafts import draft_cap, model_bends, optimal_measured, pooled_drafts, search_cap
from .rows import headline_max_new
from .stats import isnum, predicted_for
from .study_records import Study


def _groups(study: Study, pool_tasks: bool) -> dict[tuple[Any, ...], dict[int, list[str]]]:
    """Batch-1 speculative cells at the headline length: (framework, label, task, sampling) → γ → cells
    (task ``"all"`` when ``pool_tasks``, as the report's method tables pool them)."""
    mnt = headline_max_new(study)
    out: dict[tuple[Any, ...], dict[int, list[str]]] = {}
    for c in study.spec_cell_ids(None, batch_size=1):
        m = study.meta(c)
        if m["max_new_tokens"] == mnt and not m["synthetic"]:
            task = "all" if pool_tasks else m["task"]
            key = (m["framework"], m["label"], m["family"], m["model"], m["drafter"] or "", task, m["sampling"])
            out.setdefault(key, {}).setdefault(int(m["gamma"] or 0), []).append(c)
    return out


def _measured_rows(study: Study, by_gamma: dict[int, list[str]], extrapolate: bool) -> list[dict[str, Any]]:
    """The cost model with the study's own measured draft lengths, c and verification costs (same machine), per γ run."""
    per_g = {g: pooled_drafts(study, cs) for g, cs in by_gamma.items()}
    opt = optimal_measured(study, {g: cs for g, cs in by_gamma.items() if g}, extrapolate, per_g)
    if opt is None:
        return []
    rows = []
    for g, p in sorted(per_g.items()):
        pred = predicted_for(p, g)
        ratio = p.paired.speedup / pred if isnum(pred) and pred > 0 else float("nan")
        rows.append(
            {
                "alpha_hat": p.acceptance.alpha_hat,
                "gamma": g,
                "draft_share": p.cost.draft_mix.draft_share if p.cost.draft_mix else float("nan"),
                "predicted_speedup": pred,
                "measured_speedup": p.paired.speedup,
                "optimal_gamma": opt["gamma"],
                "speedup_at_optimal_gamma": opt["speedup"],
                "searched_gamma_max": opt["max_gamma"],
                "baseline_tokens_per_s": float("nan"),
                "break_even_batch": None,
                "costs_from": "measured",
                **_search(opt, p.acceptance.alpha_hat),
                "bends": model_bends(p, g, ratio),
            }
        )
    return rows


def _search(opt: dict[str, Any], alpha: float | None) -> dict[str, Any]:
    """How far a row's optimal γ was searched and why, and whether it extrapolates (with the α̂ assumed there)."""
    return {
        "search_why": opt["why"],
        "search_depth": opt["depth"],
        "extrapolated": bool(opt["extrapolated"]),
        "alpha_assumed": alpha,
    }


def _roofline_row(
    study: Study,
    profile: HardwareProfile,
    key: tuple[Any, ...],
    by_gamma: dict[int, list[str]],
    target_params: float | None,
    draft_params: float | None,
    extrapolate: bool,
) -> dict[str, Any] | None:
    """The cost model with ``profile``'s roofline step costs, the measured draft lengths (the mix of the
    deepest γ run, its drafts cut to shorter γ) and α̂."""
    _, _, family, model, drafter, _, _ = key
    allp = pooled_drafts(study, [c for cs in by_gamma.values() for c in cs])
    params = study.model_params()
    tp = target_params or params.get(model)
    if not isnum(allp.acceptance.alpha_hat) or not tp:
        return None
    dp = draft_params or (params.get(drafter) if drafter else None)
    pair = study.model_pair(model) or {}
    dt = cost_dtype(pair.get("dtype", "bf16"), pair.get("quantization", "none")) if profile.kind == "cpu" else "bf16"
    alpha = min(max(float(allp.acceptance.alpha_hat), 0.0), 1.0)
    deepest = max(by_gamma)
    mix = pooled_drafts(study, by_gamma[deepest]).cost.draft_mix
    method = study.meta(by_gamma[deepest][0])["method"]
    if mix is not None:
        cap, depth, why = search_cap([mix], method, drafter or None, extrapolate)
    else:  # no counters: γ every step, searched to the γ run unless told to extrapolate
        heads = draft_cap(method, drafter or None)[0]
        depth = deepest
        cap = (heads or 16) if extrapolate else min(deepest, heads or deepest)
        why = "uncounted_" + ("heads" if heads == cap else "search_limit" if extrapolate else "gamma_values")
    draft = dp if family != "ngram" else None
    beyond = alpha if extrapolate else None
    pred = costmodel.predict(profile, tp, draft, alpha, dt, max_gamma=cap, mix=mix, beyond=beyond)
    be = costmodel.break_even_batch(profile, tp, draft, alpha, pred.gamma, dt, mix=mix, beyond=beyond)
    opt = {"gamma": pred.gamma, "max_gamma": cap, "why": why, "depth": depth, "extrapolated": pred.gamma > depth}
    return {
        "alpha_hat": allp.acceptance.alpha_hat,
        "gamma": pred.gamma,
        "draft_share": pred.draft_share,
        "predicted_speedup": pred.speedup,
        "measured_speedup": float("nan"),
        "optimal_gamma": pred.gamma,
        "speedup_at_optimal_gamma": pred.speedup,
        "searched_gamma_max": cap,
        "baseline_tokens_per_s": pred.baseline_tokens_per_s,
        "speculative_tokens_per_s": pred.speculative_tokens_per_s,
        "break_even_batch": be,
        "costs_from": "roofline",
        "cost_profile": profile.name,
        "cost_profile_source": profile.source,
        "cost_target_params": tp,
        "cost_dtype": dt,
        **_search(opt, allp.acceptance.alpha_hat),
        "bends": (),
    }


def predict_from_study(
    study: Study,
    profile: HardwareProfile | None = None,
    *,
    target_params: float | None = None,
    draft_params: float | None = None,
    pool_tasks: bool = False,
    extrapolate: bool = False,
) -> pd.DataFrame:
    """One prediction per (framework, method, task, sampling) of ``study``, for ``profile``: numbers,
    where the costs came from and how far γ was searched, as data (:mod:`specstudy.report.predict_table`
    words them into the ``costs`` and ``note`` a reader sees).

    Without a profile the study's own measured step costs are used (its own machine: the row's
    measured speedup stands beside the prediction); with one, its roofline at the declared (or
    given) parameter counts.  The optimal γ is searched no deeper than the draft depth measured
    (nor than the drafter can draft); with ``extrapolate`` up to the drafter's cap (16 without one),
    α̂ assumed past the measured depth and the row's note saying so.
    """
    rows = []
    for key, by_gamma in sorted(_groups(study, pool_tasks).items()):
        if profile is None:
            found = _measured_rows(study, by_gamma, extrapolate)
        else:
            one = _roofline_row(study, profile, key, by_gamma, target_params, draft_params, extrapolate)
            found = [one] if one is not None else []
        fw, label, family, _, _, task, sampling = key
        rows += [
            {
                "framework": fw,
                "method": label,
                "family": family,
                "task": task,
                "sampling": sampling,
                "source_hardware": study.hardware,
                "predicted_for": profile.name if profile else study.hardware,
                **row,
            }
            for row in found
        ]
    return pd.DataFrame(rows)
