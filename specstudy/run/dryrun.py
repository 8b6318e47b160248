"""A study planned before anything runs: its cells, requests and tokens, a predicted duration and the memory fit.

``specstudy run --dry-run`` prints this for any profile on any machine, with no engine installed
and no network: it is what a user sizes a rental with.  The duration is a *prediction* from the
roofline cost model over the profile's figures, at acceptance rates assumed from the seed
article's task table (the study has not measured any yet); the memory fit adds weights, a KV
cache estimated for a Llama-shaped model of each size at the study's lengths and batch, and the
drafter, against the profile's memory times the tensor-parallel size.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import costmodel
from ..config import StudyConfig, TaskConfig, load_task_config
from ..config.task import seed_row
from ..config.vocab import cost_dtype
from ..costmodel import HardwareProfile
from ..frameworks import DECLARATIONS, server_frameworks
from .plan import CellPlan
from .precision import most_extensions
from .task_checks import parsed_task

#: prompt length assumed for the prefill of a planned request (tokens)
PROMPT_TOKENS = 512
#: reading weights from a local disk into the engine (bytes/s): a planning figure; a server's start time
#: is its declaration's ``start_s`` (llama.cpp ~1 s and vLLM-CPU ~2 min measured on the 2-core machine)
LOAD_BYTES_PER_S = 2e9
#: Llama-shaped models by size: (parameters, layers, KV width): the KV cache estimate of the memory fit
LLAMA_SHAPES = (
    (135e6, 30, 192),
    (1.1e9, 22, 256),
    (7e9, 32, 4096),
    (13e9, 40, 5120),
    (33e9, 60, 6656),
    (70e9, 80, 1024),
)


def kv_bytes_per_token(params: float, dtype: str) -> float:
    """2 (K, V) × layers × KV width × bytes, for the Llama shape nearest in size (an estimate)."""
    _, layers, width = min(LLAMA_SHAPES, key=lambda s: abs(math.log(s[0] / params)))
    return 2.0 * layers * width * costmodel.dtype_bytes(dtype)


def assumed_alpha(task: TaskConfig | str | None) -> float:
    """The middle of the seed article's α range for a task's category (what the plan assumes before
    measuring; ``task``: the study's parsed config, a name or a task file); 0.6 for a user category,
    which has no seed row, or a task that does not validate."""
    try:
        tc = task if isinstance(task, TaskConfig) or task is None else load_task_config(task)
        lo, hi = (seed_row(tc) if tc is not None else {}).get("alpha_range") or (0.6, 0.6)
    except (ValueError, OSError):
        lo, hi = 0.6, 0.6
    return (float(lo) + float(hi)) / 2


@dataclass
class CellEstimate:
    plan: CellPlan
    seconds: float | None  # None when the model pair declares no parameter count


def _params(cfg: StudyConfig) -> tuple[dict[str, float], dict[str, Any]]:
    params: dict[str, float] = {}
    pair_of: dict[str, Any] = {}
    for pair in cfg.models:
        pair_of[pair.target] = pair
        if "target" in pair.params:
            params[pair.target] = pair.params["target"]
        params.update({mid: pair.params[s] for s, mid in pair.drafters.items() if s in pair.params})
    return params, pair_of


def estimate_cell(cfg: StudyConfig, plan: CellPlan, prof: HardwareProfile) -> CellEstimate:
    """Predicted seconds of one cell on ``prof``: prefill + decode per batch, sped up at the assumed α."""
    params, pair_of = _params(cfg)
    p = params.get(plan.target)
    if not p:
        return CellEstimate(plan, None)
    pair = pair_of[plan.target]
    dt = cost_dtype(pair.dtype, pair.quantization)
    b, n = plan.cell.batch_size, plan.tensor_parallel_size
    batches = math.ceil(plan.requests / b)
    t1 = costmodel.step_time(p, prof, dt, b, 1, n)
    prefill = costmodel.step_time(p, prof, dt, b, PROMPT_TOKENS, n)
    ar = batches * (prefill + plan.sampling.max_new_tokens * t1)
    if plan.is_baseline:
        return CellEstimate(plan, ar)
    draft = params.get(plan.drafter_id or "") if plan.family == "draft_target" else None
    block = plan.cell.method in DECLARATIONS[plan.cell.framework].block_drafting
    alpha = assumed_alpha(parsed_task(cfg, plan.cell.task))
    pred = costmodel.predict(prof, p, draft, alpha, dt, b, plan.cell.gamma, n, block=block)
    return CellEstimate(plan, ar / pred.speedup if pred.speedup > 0 else None)


def setup_seconds(cfg: StudyConfig, plans: Sequence[CellPlan], prof: HardwareProfile) -> float:
    """Engine loads (weights from disk) and server starts (one per speculative configuration)."""
    params, pair_of = _params(cfg)
    total = 0.0
    for key in {p.backend_key() for p in plans}:
        target = key[1]
        if target in params:
            total += (
                params[target]
                * costmodel.dtype_bytes(cost_dtype(pair_of[target].dtype, pair_of[target].quantization))
                / LOAD_BYTES_PER_S
            )
    configs = {
        (p.cell.framework, p.cell.method, p.cell.gamma, p.drafter_id)
        for p in plans
        if p.cell.framework in server_frameworks()
    }
    return total + sum(DECLARATIONS[fw].start_s for fw, *_ in configs)


def within_budget(
    cfg: StudyConfig, plans: Sequence[CellPlan], prof: HardwareProfile, minutes: float
) -> tuple[list[str], list[str]]:
    """(sweeps kept, sweeps cut): the profile's sweeps in its own order (its priority, calibration
    first) while the predicted minutes of all kept so far, engine starts included, fit ``minutes``;
    the first that does not fit and every later one are cut."""
    kept: list[str] = []
    chosen: list[CellPlan] = []
    names = [s.name for s in cfg.sweeps]
    for i, sw in enumerate(names):
        trial = chosen + [p for p in plans if sw in p.sweeps and p not in chosen]
        seconds = sum(estimate_cell(cfg, p, prof).seconds or 0.0 for p in trial) + setup_seconds(cfg, trial, prof)
        if seconds / 60 > minutes:
            return kept, names[i:]
        kept, chosen = [*kept, sw], trial
    return kept, []


def duration_table(cfg: StudyConfig, plans: Sequence[CellPlan], prof: HardwareProfile) -> list[dict[str, Any]]:
    """One row per sweep (a shared cell counted in its first sweep) and a total: cells, requests, tokens, minutes."""
    est = [estimate_cell(cfg, p, prof) for p in plans]
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for sw in [s.name for s in cfg.sweeps]:
        mine = [e for e in est if sw in e.plan.sweeps and e.plan.cell_id not in seen]
        seen.update(e.plan.cell_id for e in mine)
        known = [e.seconds for e in mine if e.seconds is not None]
        rows.append(
            {
                "sweep": sw,
                "cells": len(mine),
                "requests": sum(e.plan.requests for e in mine),
                "output_tokens": sum(e.plan.requests * e.plan.sampling.max_new_tokens for e in mine),
                "predicted_minutes": round(sum(known) / 60, 1) if known else None,
                "cells_without_prediction": len(mine) - len(known),
            }
        )
    setup = setup_seconds(cfg, plans, prof)
    decode = sum(e.seconds or 0.0 for e in est)
    rows.append(
        {
            "sweep": "engine loads and server starts",
            "cells": 0,
            "requests": 0,
            "output_tokens": 0,
            "predicted_minutes": round(setup / 60, 1),
            "cells_without_prediction": 0,
        }
    )
    extra = most_extensions(cfg, plans)
    if extra:
        known = [e.seconds for e in (estimate_cell(cfg, p, prof) for p in extra) if e.seconds is not None]
        rows.append(
            {
                "sweep": "precision targets: at most, if none is met (not in TOTAL)",
                "cells": len(extra),
                "requests": sum(p.requests for p in extra),
                "output_tokens": sum(p.requests * p.sampling.max_new_tokens for p in extra),
                "predicted_minutes": round(sum(known) / 60, 1) if known else None,
                "cells_without_prediction": len(extra) - len(known),
            }
        )
    rows.append(
        {
            "sweep": "TOTAL",
            "cells": len(plans),
            "requests": sum(p.requests for p in plans),
            "output_tokens": sum(p.requests * p.sampling.max_new_tokens for p in plans),
            "predicted_minutes": round((decode + setup) / 60, 1),
            "cells_without_prediction": sum(e.seconds is None for e in est),
        }
    )
    return rows


def cell_breakdown(plans: Sequence[CellPlan]) -> list[dict[str, Any]]:
    """Cells by framework, method, model pair, γ, batch and rate (tasks counted)."""
    count: Counter[tuple[Any, ...]] = Counter()
    tasks: dict[tuple[Any, ...], set[str]] = {}
    for p in plans:
        rate = None if p.request_rate is None else ("inf" if math.isinf(p.request_rate) else p.request_rate)
        key = (p.cell.framework, p.label, p.target, p.drafter_id or "", p.cell.gamma, p.cell.batch_size, rate)
        count[key] += 1
        tasks.setdefault(key, set()).add(p.cell.task)
    return [
        {
            "framework": k[0],
            "method": k[1],
            "target": k[2],
            "drafter": k[3],
            "gamma": k[4],
            "batch": k[5],
            "rate": k[6],
            "tasks": len(tasks[k]),
            "cells": n,
        }
        for k, n in sorted(count.items(), key=lambda kv: str(kv[0]))
    ]


def memory_fit(cfg: StudyConfig, plans: Sequence[CellPlan], prof: HardwareProfile) -> list[dict[str, Any]]:
    """Per model pair and drafter: weights + KV cache at the study's longest cell + drafter vs memory × TP."""
    params, _ = _params(cfg)
    rows: list[dict[str, Any]] = []
    for pair in cfg.models:
        mine = [p for p in plans if p.target == pair.target]
        if not mine or pair.target not in params:
            rows.append(
                {
                    "pair": pair.name,
                    "target": pair.target,
                    "fits": None,
                    "note": "no parameter count declared (study.models[].params.target)",
                }
            )
            continue
        dt = cost_dtype(pair.dtype, pair.quantization)
        tokens = max(p.cell.batch_size * (PROMPT_TOKENS + p.sampling.max_new_tokens) for p in mine)
        weights = params[pair.target] * costmodel.dtype_bytes(dt)
        kv = kv_bytes_per_token(params[pair.target], dt if dt != "int4" else "bf16") * tokens
        for short, mid in {"(none)": None, **dict(pair.drafters)}.items():
            d_bytes = params.get(mid, 0.0) * costmodel.dtype_bytes(cost_dtype(pair.dtype)) if mid else 0.0
            need = weights + kv + d_bytes
            cap = prof.memory_gb * 1e9 * pair.tensor_parallel_size
            rows.append(
                {
                    "pair": pair.name,
                    "target": pair.target,
                    "drafter": short if mid else "—",
                    "weights_gb": round(weights / 1e9, 2),
                    "kv_cache_gb": round(kv / 1e9, 2),
                    "drafter_gb": round(d_bytes / 1e9, 2),
                    "need_gb": round(need / 1e9, 1),
                    "available_gb": round(cap / 1e9, 1),
                    "tensor_parallel_size": pair.tensor_parallel_size,
                    "fits": need <= 0.9 * cap,
                    "note": f"KV for {tokens} tokens (batch × (prompt {PROMPT_TOKENS} + output)), "
                    "estimated for a Llama-shaped model of that size",
                }
            )
    return rows


def deployment_plan(cfg: StudyConfig, profile: HardwareProfile | None, refine_steps: int = 0) -> list[dict[str, Any]]:
    """What the deployment decisions (issue 35) will rest on: the capacity probes and their SLO, the γ
    buckets and their repeats, the constrained tasks per engine, the energy counter and the price."""
    from ..config.schema import Slo
    from ..frameworks import declaration

    slo = Slo.model_validate(dict(cfg.slo))
    rows: list[dict[str, Any]] = []
    for sw in cfg.sweeps:
        if sw.request_rates or sw.service_factors:
            rates = (
                f"rates {', '.join(f'{f:g}' for f in sw.service_factors)} x the rate its closed-loop probe serves here"
                if sw.service_factors
                else f"rates {', '.join(f'{r:g}' for r in sw.request_rates)} req/s"
            )
            rows.append(
                {
                    "decision": "capacity under the SLO",
                    "sweep": sw.name,
                    "plan": f"{', '.join(sw.frameworks)}: {rates}, "
                    f"{sw.max_prompts} requests per probe, {sw.repeats} repeat(s), {refine_steps} search round(s); "
                    f"SLO {slo.describe_percentile()}",
                }
            )
        if len(sw.gammas) > 1 and not sw.request_rates:
            few = " (fewer than 3 repeats: the robust score is the median alone)" if sw.repeats < 3 else ""
            rows.append(
                {
                    "decision": "γ per load",
                    "sweep": sw.name,
                    "plan": f"{', '.join(sw.frameworks)}: γ {', '.join(map(str, sw.gammas))} at batch "
                    f"{', '.join(map(str, sw.batch_sizes))}, {sw.repeats} repeat(s){few}",
                }
            )
        for task in sw.tasks:
            parsed = cfg.tasks.get(task)
            so = parsed.config.structured_output if parsed is not None and parsed.config is not None else None
            if so is not None:
                combine = {True: "combines it with speculation", False: "does not combine it", None: "not documented"}
                engines = "; ".join(f"{f} {combine[declaration(f).structured_with_speculation]}" for f in sw.frameworks)
                rows.append({"decision": "structured outputs", "sweep": sw.name, "plan": f"task {task}: {engines}"})
    gpu = profile is not None and profile.kind == "gpu"
    rows.append(
        {
            "decision": "energy per token",
            "sweep": "every cell",
            "plan": "NVML's total-energy counter per GPU"
            if gpu
            else "RAPL package counters where readable (said where not)",
        }
    )
    price = (
        f"US$ {profile.price_usd_per_hour:g} per {'GPU-hour' if gpu else 'hour of the whole machine'} "
        f"({profile.price_date}; {profile.price_source})"
        if profile is not None and profile.price_usd_per_hour
        else "no price stated: $ per million tokens not computed (specstudy report --price-per-hour)"
    )
    rows.append({"decision": "cost per token", "sweep": "every cell", "plan": price})
    return rows
