"""An engine's own step costs beside its rows: why draft-model speculation wins or loses there.

The seed's FAQ (case 1) says speculation stops paying once verifying γ+1 tokens costs much more
than one decode step.  For llama.cpp the study measures that cost itself (T(k)/T(1) from k-token
extensions of a cached prompt, and c = draft / target decode time per token: see
:mod:`specstudy.run.engine_cost_probe`); here each llama.cpp row's measured speedup is set beside the
cost model's prediction from its measured α̂, that c and T(γ+1)/T(1).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from . import stats
from .drafts import model_bends, pooled_drafts
from .study_records import Study

CURVE_COLUMNS = ["framework", "model", "drafter", "k", "verify_ms", "verify_ratio", "c", "threads", "load_1m"]
ROW_COLUMNS = [
    "label",
    "task",
    "sampling",
    "drafter",
    "gamma",
    "n",
    "alpha",
    "alpha_hat",
    "c",
    "verify_ratio",
    "prefill_share",
    "speedup",
    "speedup_ci",
    "predicted_speedup",
    "measured_over_predicted",
    "model_bends",
    "cells",
]


def _by_k(d: dict[Any, Any] | None) -> dict[int, float]:
    return {int(k): float(v) for k, v in (d or {}).items()}


def cost_curves(study: Study) -> pd.DataFrame:
    """One row per (engine measurement, k): verification ms of k new tokens and T(k)/T(1)."""
    rows = []
    for doc in study.engine_costs:
        ms, ratio = _by_k(doc.get("verify_ms")), _by_k(doc.get("verify_ratio"))
        load = (doc.get("load_average") or {}).get("before") or [float("nan")]
        for k in sorted(ratio):
            rows.append(
                {
                    "framework": doc.get("framework"),
                    "model": doc.get("model"),
                    "drafter": doc.get("drafter"),
                    "k": k,
                    "verify_ms": ms.get(k),
                    "verify_ratio": ratio[k],
                    "c": doc.get("c"),
                    "threads": doc.get("threads"),
                    "load_1m": load[0],
                }
            )
    return pd.DataFrame(rows, columns=CURVE_COLUMNS)


def _doc_for(study: Study, target: str, drafter: str | None) -> dict[str, Any] | None:
    docs = [d for d in study.engine_costs if d.get("framework") == "llamacpp" and d.get("model") == target]
    return next((d for d in docs if d.get("drafter") == drafter), None) or (docs[0] if docs and not drafter else None)


def predicted_rows(study: Study) -> pd.DataFrame:
    """Each llama.cpp speculative (label, task, γ) at batch 1: measured speedup and the cost model's."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for cid in study.cell_ids(framework="llamacpp", batch_size=1):
        m = study.meta(cid)
        if m["method"] != "ar" and not m.get("synthetic"):
            key = (m["label"], m["task"], m["sampling"], m["model"], m["drafter"], m["method"], m["gamma"])
            groups.setdefault(key, []).append(cid)
    rows = []
    for (label, task, sampling, model, drafter, method, gamma), cids in sorted(
        groups.items(), key=lambda kv: str(kv[0])
    ):
        doc = _doc_for(study, model, drafter if method == "draft_target" else None)
        if doc is None:
            continue
        c = float(doc["c"]) if method == "draft_target" and doc.get("c") is not None else 0.0
        by_k = _by_k(doc.get("verify_ratio"))
        v = by_k.get(int(gamma) + 1, float("nan"))
        p = pooled_drafts(study, cids)  # with its measured draft lengths: n-gram steps draft only on a match
        curve = stats.verify_curve({k - 1: r for k, r in by_k.items() if k > 1})  # a draft of k verifies k + 1
        pred = stats.predicted_for(p, gamma, c, curve if p.cost.draft_mix is not None and curve is not None else v)
        ratio = p.paired.speedup / pred if stats.isnum(pred) and pred > 0 else float("nan")
        rows.append(
            {
                "label": label,
                "task": task,
                "sampling": sampling,
                "drafter": drafter or "—",
                "gamma": gamma,
                "n": p.sample.n_prompts,
                "alpha": p.acceptance.alpha,
                "alpha_hat": p.acceptance.alpha_hat,
                "c": c,
                "verify_ratio": v,
                "prefill_share": p.cost.prefill_share,
                "speedup": p.paired.speedup,
                "speedup_ci": p.paired.speedup_ci,
                "predicted_speedup": pred,
                "measured_over_predicted": ratio,
                "model_bends": model_bends(p, gamma, ratio) if stats.isnum(pred) else None,
                "cells": tuple(cids),
            }
        )
    return pd.DataFrame(rows, columns=ROW_COLUMNS)
