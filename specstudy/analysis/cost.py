"""Cost and energy per output token, per row, beside the row's paired AR baseline.

Energy is read, never estimated: NVML's total-energy counter on NVIDIA GPUs and RAPL's package
counters on a CPU, each over the cell's measured requests (telemetry samples, warm-up excluded);
where neither is readable the row says so.  Cost turns a stated price per GPU-hour (the hardware
profile's, with its date and source; ``specstudy report --price-per-hour`` overrides it) into $ per
million output tokens at the row's measured throughput, with the row's TPOT beside it so rows
compare at a stated service level.  Pure.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..metrics import output_throughput, percentiles, tpot
from ..records import RequestRecord
from ..telemetry import energy_of
from .study_records import Study

#: set by ``specstudy report --price-per-hour`` (the notebooks run in subprocesses and inherit it)
PRICE_ENV = "SPECSTUDY_PRICE_PER_HOUR"
_ROW = (
    "framework",
    "label",
    "task",
    "model",
    "drafter",
    "gamma",
    "batch_size",
    "request_rate",
    "sampling",
    "max_new_tokens",
)


@dataclass(frozen=True)
class Price:
    usd_per_gpu_hour: float
    date: str
    source: str
    #: what one unit of the price rents: a GPU, or on a CPU profile the whole machine
    per: str = "GPU-hour"


def price_of(study: Study) -> Price | None:
    """The command line's price if given, else the hardware profile's; None: no price stated."""
    env = os.environ.get(PRICE_ENV)
    prof = study.profile
    per = "hour of the whole machine" if prof is not None and prof.kind == "cpu" else "GPU-hour"
    if env:
        value = float(env)
        if not value > 0:
            raise ValueError(f"--price-per-hour={env}: allowed a positive number of US$ per {per}")
        return Price(value, "given on the command line", "--price-per-hour", per)
    if prof is None or prof.price_usd_per_hour is None:
        return None
    return Price(prof.price_usd_per_hour, prof.price_date, prof.price_source, per)


def usd_per_million_tokens(usd_per_hour: float, gpus: int, tokens_per_s: float) -> float:
    """$ per 1e6 output tokens when ``gpus`` GPUs at ``usd_per_hour`` each produce ``tokens_per_s``."""
    if not tokens_per_s > 0:
        return math.nan
    return usd_per_hour * gpus / 3600.0 / tokens_per_s * 1e6


def cell_energy(study: Study) -> dict[str, dict[str, Any]]:
    """Per cell: joules of the GPUs and of the CPU packages over its measured requests (None where unread)."""
    tel = study.telemetry
    if tel is None or "cell_id" not in tel:
        return {}
    return {str(cid): energy_of(g.to_dict("records")) for cid, g in tel.groupby("cell_id")}


def _gpus(study: Study, model: str) -> int:
    pair = study.model_pair(model) or {}
    return int(pair.get("tensor_parallel_size") or 1)


def _per_token(energy: dict[str, dict[str, Any]], cells: Sequence[str], key: str, tokens: int) -> float:
    vals = [energy.get(c, {}).get(key) for c in cells]
    if not cells or tokens <= 0 or any(v is None for v in vals):
        return math.nan
    return float(sum(v for v in vals if v is not None)) / tokens


def _ok(study: Study, cells: Sequence[str]) -> list[RequestRecord]:
    return [r for c in cells for r in study.records.get(c, []) if r.status == "ok"]


def _row_figures(study: Study, cells: Sequence[str], energy: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Throughput (Σ tokens / Σ cell span over repeats), TPOT p50 and J per output token of some cells."""
    recs = _ok(study, cells)
    tokens = sum(r.output_tokens for r in recs)
    spans = [s for s in (tokens_span(_ok(study, [c])) for c in cells) if s > 0]
    tps = tokens / sum(spans) if spans else math.nan
    return {
        "tokens_per_s": tps,
        "tpot_p50_ms": percentiles([tpot(r) for r in recs], (50,))["p50"] * 1e3 if recs else math.nan,
        "gpu_j_per_token": _per_token(energy, cells, "gpu_energy_j", tokens),
        "cpu_j_per_token": _per_token(energy, cells, "cpu_energy_j", tokens),
    }


def tokens_span(recs: Sequence[RequestRecord]) -> float:
    """The wall span of a cell's requests (first send to last finish): what its energy integrates over."""
    if not recs:
        return 0.0
    tps = output_throughput(recs)
    return sum(r.output_tokens for r in recs) / tps if tps > 0 else 0.0


def cost_energy_frame(study: Study, tpot_slo_ms: float | None = None) -> pd.DataFrame:
    """One row per (framework, method label, task, γ, batch, rate, sampling), repeats pooled, with its
    paired AR's figures beside it; synthetic-acceptance cells are left out (nothing about them is a service)."""
    energy, price = cell_energy(study), price_of(study)
    groups: dict[tuple[Any, ...], list[str]] = {}
    for cid, m in study.cells.items():
        if not m.get("synthetic"):
            groups.setdefault(tuple(m[k] for k in _ROW), []).append(cid)
    rows = []
    for key, cells in sorted(groups.items(), key=lambda kv: str(kv[0])):
        meta = dict(zip(_ROW, key))
        base = sorted({b for c in cells if (b := study.cells[c]["baseline_cell_id"])})
        own = _row_figures(study, cells, energy)
        ar = _row_figures(study, base, energy) if base else dict.fromkeys(own, math.nan)
        gpus = _gpus(study, meta["model"])
        hourly = price.usd_per_gpu_hour if price else math.nan
        rows.append(
            {
                **meta,
                "gpus": gpus,
                **own,
                "meets_tpot_slo": (own["tpot_p50_ms"] <= tpot_slo_ms) if tpot_slo_ms else None,
                "usd_per_m_tokens": usd_per_million_tokens(hourly, gpus, own["tokens_per_s"]),
                **{f"ar_{k}": v for k, v in ar.items()},
                "ar_usd_per_m_tokens": usd_per_million_tokens(hourly, gpus, ar["tokens_per_s"]),
            }
        )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class EnergyRead:
    """Which energy counters this study read: GPU (NVML), CPU (RAPL), and why RAPL was not readable."""

    gpu: bool
    cpu: bool
    cpu_unavailable: tuple[str, ...]
    gpu_machine: bool


def energy_read(study: Study) -> EnergyRead:
    """What energy the study could read, and the reasons RAPL gave where it could not (said, never estimated)."""
    energy = cell_energy(study)
    return EnergyRead(
        gpu=any(e.get("gpu_energy_j") is not None for e in energy.values()),
        cpu=any(e.get("cpu_energy_j") is not None for e in energy.values()),
        cpu_unavailable=tuple(
            sorted({str(e["cpu_energy_unavailable"]) for e in energy.values() if e.get("cpu_energy_unavailable")})
        ),
        gpu_machine=study.profile is not None and study.profile.kind == "gpu",
    )
