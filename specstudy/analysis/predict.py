"""Predictions for another machine from a finished study's measured acceptance.

Acceptance depends on the model pair, the task and the sampling, not on the hardware; step
costs depend on the hardware.  So the measured i.i.d. acceptance α̂ of each (framework, method,
task, sampling) of one study, with a profile's roofline step costs (or the study's own measured
costs), predicts the seed-shaped table for that profile: baseline and speculative tokens/s, the
optimal γ, the speedup and the break-even batch.  Every row says it is a prediction and where its
costs came from.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from .. import costmodel
from ..config.vocab import cost_dtype
from ..costmodel import HardwareProfile
from .stats import isnum, pooled, predicted_for, verify_curve
from .study import Study
from .tables import headline_max_new


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


def _measured_rows(study: Study, by_gamma: dict[int, list[str]]) -> list[dict[str, Any]]:
    """The cost model with the study's own measured c and verification costs (same machine), per γ run."""
    per_g = {g: pooled(study, cs) for g, cs in by_gamma.items()}
    allp = pooled(study, [c for cs in by_gamma.values() for c in cs])
    if not (isnum(allp.alpha_hat) and isnum(allp.c) and isnum(allp.verify_ratio)):
        return []
    curve = verify_curve({g: p.verify_ratio for g, p in per_g.items() if isnum(p.verify_ratio)})
    g_opt, s_opt = costmodel.optimal_gamma(min(float(allp.alpha_hat), 1.0), allp.c, 2 * max(per_g), curve)
    return [
        {
            "alpha_hat": p.alpha_hat,
            "gamma": g,
            "predicted_speedup": predicted_for(p, g),
            "measured_speedup": p.speedup,
            "optimal_gamma": g_opt,
            "speedup_at_optimal_gamma": s_opt,
            "baseline_tokens_per_s": float("nan"),
            "break_even_batch": None,
            "costs": "measured (this study)",
        }
        for g, p in sorted(per_g.items())
    ]


def _roofline_row(
    study: Study,
    profile: HardwareProfile,
    key: tuple[Any, ...],
    by_gamma: dict[int, list[str]],
    target_params: float | None,
    draft_params: float | None,
) -> dict[str, Any] | None:
    """The cost model with ``profile``'s roofline step costs and the measured α̂."""
    _, _, family, model, drafter, _, _ = key
    allp = pooled(study, [c for cs in by_gamma.values() for c in cs])
    params = study.model_params()
    tp = target_params or params.get(model)
    if not isnum(allp.alpha_hat) or not tp:
        return None
    dp = draft_params or (params.get(drafter) if drafter else None)
    pair = study.model_pair(model) or {}
    dt = cost_dtype(pair.get("dtype", "bf16"), pair.get("quantization", "none")) if profile.kind == "cpu" else "bf16"
    alpha = min(max(float(allp.alpha_hat), 0.0), 1.0)
    pred = costmodel.predict(profile, tp, dp if family != "ngram" else None, alpha, dt)
    be = costmodel.break_even_batch(profile, tp, dp if family != "ngram" else None, alpha, pred.gamma, dt)
    return {
        "alpha_hat": allp.alpha_hat,
        "gamma": pred.gamma,
        "predicted_speedup": pred.speedup,
        "measured_speedup": float("nan"),
        "optimal_gamma": pred.gamma,
        "speedup_at_optimal_gamma": pred.speedup,
        "baseline_tokens_per_s": pred.baseline_tokens_per_s,
        "speculative_tokens_per_s": pred.speculative_tokens_per_s,
        "break_even_batch": be,
        "costs": f"roofline ({profile.name}, {profile.source}), {tp:.3g} parameters {dt}",
    }


def predict_from_study(
    study: Study,
    profile: HardwareProfile | None = None,
    *,
    target_params: float | None = None,
    draft_params: float | None = None,
    pool_tasks: bool = False,
) -> pd.DataFrame:
    """One prediction per (framework, method, task, sampling) of ``study``, for ``profile``.

    Without a profile the study's own measured step costs are used (its own machine: the row's
    measured speedup stands beside the prediction); with one, its roofline at the declared (or
    given) parameter counts.
    """
    rows = []
    for key, by_gamma in sorted(_groups(study, pool_tasks).items()):
        if profile is None:
            found = _measured_rows(study, by_gamma)
        else:
            one = _roofline_row(study, profile, key, by_gamma, target_params, draft_params)
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
