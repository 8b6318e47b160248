"""Input-length tiers, the random-token control beside them, and entropy tiers.

* **Input-length tiers** (a task's ``tiers:``; :mod:`specstudy.data.tier_prompts`): one row per tier and
  kind of prompt (real text, random tokens), from the records' ``input_policy``.  The random
  control's speedup over the real prompts' at the same tier says how much random inputs distort
  speculative throughput (SPEED-Bench reports an overstatement of about 23 %); both are measured.
* **Entropy tiers**: each task's prompts split into thirds (low, mixed, high) by the target's own
  mean per-token entropy over its AR baseline's greedy output (the entropy the engine measured
  while decoding, :mod:`specstudy.engine.entropy`: no extra forward); only where the engine reports
  it (the reference engine and HF).  SPEED-Bench's entropy tiers are sets chosen in advance; these are
  terciles of this study's own prompts, named so.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..data.tier_prompts import parse_tier
from ..intervals import MIN_PROMPTS_FOR_CI
from ..records import RequestRecord
from .claims import Estimate, compare
from .stats import Keep
from .strata import spec_groups, stratum_row
from .study_records import Study

ENTROPY_TIERS = ("low", "mixed", "high")


def _tier_of(r: RequestRecord) -> tuple[int, bool] | None:
    return parse_tier(r.input_policy)


def _is(tier: tuple[int, bool]) -> Keep:
    return lambda r: _tier_of(r) == tier


def tier_frame(study: Study) -> pd.DataFrame:
    """One row per (framework, method, γ, task, batch, input tier, real or random) of tiered cells."""
    cells = [
        cid
        for cid in study.cell_ids()
        if study.meta(cid)["baseline_cell_id"] and any(_tier_of(r) for r in study.records.get(cid, []))
    ]
    rows = []
    for key, cids in spec_groups(study, cells).items():
        tiers = sorted({t for c in cids for r in study.records[c] if (t := _tier_of(r)) is not None})
        for tokens, rnd in tiers:
            rows.append(
                stratum_row(
                    study, key, cids, _is((tokens, rnd)), input_tokens=tokens, prompts="random" if rnd else "real"
                )
            )
    return pd.DataFrame(rows)


def random_overstatement(raw: pd.DataFrame) -> pd.DataFrame:
    """Per row and tier: random tokens against real prompts, speedup and α, each with its interval
    and a verdict from the two intervals (SPEED-Bench expects random above real:
    :func:`specstudy.analysis.claims.compare`); ``ratio`` is random / real speedup (1.23: random
    overstates by 23 %), a point value the verdict qualifies."""
    if raw.empty or not (raw["prompts"] == "random").any():
        return pd.DataFrame()
    keys = ["framework", "label", "gamma", "task", "batch_size", "input_tokens"]
    real = raw[raw["prompts"] == "real"].set_index(keys)
    rnd = raw[raw["prompts"] == "random"].set_index(keys)
    rows = []
    for key in rnd.index.intersection(real.index):
        a, b = rnd.loc[key], real.loc[key]
        row = dict(zip(keys, key))
        for what in ("speedup", "alpha"):
            ra, rb = Estimate.of(a, what), Estimate.of(b, what)
            row |= {f"real_{what}": rb, f"random_{what}": ra, f"{what}_verdict": compare(ra, rb, "above")}
        row |= {"real": b["speedup"], "random": a["speedup"], "ratio": a["speedup"] / b["speedup"]}
        rows.append(row)
    return pd.DataFrame(rows)


def entropy_terciles(baseline: list[RequestRecord]) -> dict[tuple[str, str], str]:
    """(task, prompt id) → low / mixed / high: thirds of the prompts by their AR output's mean entropy."""
    means: dict[tuple[str, str], float] = {}
    for r in baseline:
        if r.status == "ok" and r.token_entropy:
            means[(r.task, r.prompt_id)] = float(np.mean(r.token_entropy))
    if len(means) < 3:
        return {}
    order = sorted(means, key=lambda k: means[k])
    return {k: ENTROPY_TIERS[min(2, 3 * i // len(order))] for i, k in enumerate(order)}


def _in(tiers: dict[tuple[str, str], str], tier: str) -> Keep:
    return lambda r: tiers.get((r.task, r.prompt_id)) == tier


def entropy_tier_frame(study: Study, pool_tasks: bool = False) -> pd.DataFrame:
    """One row per (framework, method, γ, task, batch, entropy tier) where the engine measured entropy;
    ``pool_tasks``: one row per method over all its tasks (terciles over all their prompts), for a
    study whose per-task tiers hold too few prompts each for an interval."""
    rows: list[dict[str, Any]] = []
    spec = [c for c in study.cell_ids() if study.meta(c)["baseline_cell_id"]]
    groups = spec_groups(study, spec)
    if pool_tasks:
        pooled_groups: dict[tuple[Any, ...], list[str]] = {}
        for (fw, label, gamma, _task, cache, batch), cids in groups.items():
            pooled_groups.setdefault((fw, label, gamma, "all tasks", cache, batch), []).extend(cids)
        groups = pooled_groups
    for key, cids in groups.items():
        tiers = entropy_terciles([r for c in cids for r in study.baseline(c)])
        if not tiers:
            continue
        for tier in ENTROPY_TIERS:
            rows.append(stratum_row(study, key, cids, _in(tiers, tier), entropy_tier=tier))
    return pd.DataFrame(rows)


def entropy_tiers_shown(study: Study) -> tuple[pd.DataFrame, str]:
    """The entropy-tier frame the report can show, and how it was chosen: ``"per task"``; ``"pooled"``
    over each method's tasks when no per-task row has prompts enough for an interval; ``"left out"``
    (an empty frame) when not even the pooled rows do."""
    per_task = entropy_tier_frame(study)
    if per_task.empty or (per_task["n_prompts"] >= MIN_PROMPTS_FOR_CI).any():
        return per_task, "per task"
    pooled_rows = entropy_tier_frame(study, pool_tasks=True)
    if (pooled_rows["n_prompts"] >= MIN_PROMPTS_FOR_CI).any():
        return pooled_rows, "pooled"
    return pooled_rows.iloc[0:0], "left out"
