"""A study's serving cells as frames: the request-rate sweep, the sender's schedule, the prefix cache.

FAQ Q2: under continuous batching, sweep the request rate and plot throughput against latency;
speculation pays most at small batches, so know the batch the engine actually runs.  One row per
request-rate cell: offered rate, achieved request and output throughput, TTFT / TPOT p50 and p99,
goodput under the study's SLO (``study.slo``; default TPOT ≤ 50 ms, the seed's comfortable-chat
figure), the engine's
mean running batch from its own gauge (sampled while the run lasted), the load generator's send
lag, and the paired speedup against AR at the same rate.  Every number comes from
:mod:`specstudy.metrics` or from what the engine reported; nothing here writes a file.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from .. import metrics
from ..config.schema import Slo
from ..records import RequestRecord, cut_short
from .study_records import Study

#: the schema's default (the seed's FAQ Q1: TPOT ≤ 50 ms reads as comfortable real-time chat)
DEFAULT_SLO = Slo()


def study_slo(study: Study) -> Slo:
    """The SLO the study states (``study.slo`` in its YAML), else :data:`DEFAULT_SLO`."""
    block = study.config.get("slo")
    return Slo(**block) if isinstance(block, dict) else DEFAULT_SLO


def send_lag(records: Sequence[RequestRecord]) -> dict[str, float]:
    """The load generator's lag (actual − scheduled send, ms): p50 and max over the records that went out."""
    lag = [
        1e3 * (r.sent_s - r.scheduled_send_s)
        for r in records
        if r.sent_s is not None and r.scheduled_send_s is not None
    ]
    if not lag:
        return {"p50_ms": metrics.NAN, "max_ms": metrics.NAN, "n": 0.0}
    return {"p50_ms": metrics.percentiles(lag, (50,))["p50"], "max_ms": max(lag), "n": float(len(lag))}


def run_block(records: Sequence[RequestRecord], key: str) -> dict[str, Any]:
    """A run-level block every record of a run carries (``server_watch``, ``prefix_cache_counters``)."""
    for r in records:
        block = (r.extra or {}).get(key)
        if isinstance(block, dict):
            return block
    return {}


def gauge_mean(records: Sequence[RequestRecord], gauge: str) -> float:
    """The time average of one of the engine's gauges over the run (NaN when it reports none)."""
    g = (run_block(records, "server_watch").get("gauges") or {}).get(gauge) or {}
    v = g.get("mean")
    return float(v) if v is not None else metrics.NAN


def peak_memory(records: Sequence[RequestRecord]) -> tuple[float, str]:
    """(peak bytes, source) over a cell's records; (NaN, "—") when the backend measured none."""
    peaks = [(r.peak_memory_bytes, r.memory_source or "") for r in records if r.peak_memory_bytes is not None]
    if not peaks:
        return metrics.NAN, "—"
    top = max(peaks, key=lambda p: p[0])
    return float(top[0]), top[1]


def _rate(value: float | None) -> float:
    return math.inf if value is None else float(value)


def rate_frame(study: Study, slo: Slo | None = None) -> pd.DataFrame:
    """One row per request-rate cell (numbers, not text): the sweep's raw table; goodput under
    ``slo`` (default: the study's own, :func:`study_slo`)."""
    slo = slo or study_slo(study)
    flags = getattr(study, "flags", None) or {}
    rows = []
    for cid in study.cell_ids():
        m = study.meta(cid)
        if m["request_rate"] is None:
            continue
        recs = study.records[cid]
        lat = metrics.latency_summary(recs)
        lag = send_lag(recs)
        base = study.baseline(cid)
        cut = sum(r.status == "cut" for r in recs)
        # a probe cut short (its SLO broken: run/capacity_search.py) pairs only its first prompts: no speedup
        whole = base and not cut_short([*recs, *base])
        sp = metrics.paired_speedup(base, recs)["speedup"] if whole else metrics.NAN
        peak, source = peak_memory(recs)
        rows.append(
            {
                "cell_id": cid,
                "framework": m["framework"],
                "label": m["label"],
                "method": m["method"],
                "gamma": m["gamma"],
                "prefix_cache": m["prefix_cache"],
                "task": m["task"],
                "rate": _rate(m["request_rate"]),
                "arrivals": m.get("arrivals") or "poisson",
                "n": len(recs),
                "ok": sum(r.status == "ok" for r in recs),
                "cut": cut,
                "request_throughput_rps": metrics.request_throughput(recs),
                "output_throughput_tps": metrics.output_throughput(recs),
                "ttft_p50_s": lat["ttft_s_p50"],
                "ttft_p99_s": lat["ttft_s_p99"],
                "tpot_p50_s": lat["tpot_s_p50"],
                "tpot_p99_s": lat["tpot_s_p99"],
                "goodput_rps": metrics.goodput(recs, ttft_s=slo.ttft_s, tpot_s=slo.tpot_s, e2e_s=slo.e2e_s),
                "mean_running": gauge_mean(recs, "running"),
                "mean_waiting": gauge_mean(recs, "waiting"),
                "send_lag_p50_ms": lag["p50_ms"],
                "send_lag_max_ms": lag["max_ms"],
                "speedup": sp,
                "peak_memory_bytes": peak,
                "memory_source": source,
                "flagged": cid in flags,
            }
        )
    return pd.DataFrame(rows)


def with_arrivals(raw: pd.DataFrame) -> pd.DataFrame:
    """The frame with an ``arrivals`` column (frames built before arrivals existed were all Poisson)."""
    return raw if "arrivals" in raw else raw.assign(arrivals="poisson")


def trace_frame(raw: pd.DataFrame) -> pd.DataFrame:
    """The rate cells of tasks replayed from a trace: each trace run beside the Poisson run of the
    same requests at the trace's mean rate (the sweep's ``arrivals: [trace, poisson]``)."""
    if raw.empty:
        return raw
    traced = set(raw.loc[raw["arrivals"] == "trace", "task"])
    return raw[raw["task"].isin(traced)]


def prefix_cache_frame(study: Study) -> pd.DataFrame:
    """Cells run with the prefix cache off and on: the engine's own lookups, hits and hit rate
    (run-level counters), beside TTFT p50, per framework, method and setting."""
    rows = []
    for cid in study.cell_ids():
        m = study.meta(cid)
        recs = study.records[cid]
        block = run_block(recs, "prefix_cache_counters")
        same = study.cell_ids(framework=m["framework"], task=m["task"], label=m["label"], gamma=m["gamma"])
        settings = {study.meta(c)["prefix_cache"] for c in same}
        if not ({True, False} <= settings):  # only cells whose twin with the other setting exists
            continue
        lat = metrics.latency_summary(recs)
        rows.append(
            {
                "framework": m["framework"],
                "label": m["label"],
                "gamma": m["gamma"],
                "task": m["task"],
                "batch_size": m["batch_size"],
                "rate": _rate(m["request_rate"]) if m["request_rate"] is not None else None,
                "prefix_cache": m["prefix_cache"],
                "queries_tokens": block.get("queries"),
                "hits_tokens": block.get("hits"),
                "hit_rate": block.get("hit_rate"),
                "source": block.get("source", "—"),
                "ttft_p50_s": lat["ttft_s_p50"],
                "e2e_p50_s": lat["e2e_s_p50"],
                "n": len(recs),
            }
        )
    return pd.DataFrame(rows)
