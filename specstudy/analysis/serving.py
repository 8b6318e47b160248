"""Serving-run summaries: latency percentiles, throughputs, goodput and paired comparisons per load point.

Every number comes from :mod:`specstudy.metrics`; these functions only choose which ones a
serving sweep reports and pair the speculative arm with its AR baseline at the same rate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .. import metrics
from ..config.schema import Slo
from ..records import RequestRecord


def json_safe(x: Any) -> Any:
    """NaN and infinities as None, tuples as lists, keys as strings: JSON that any reader parses."""
    if isinstance(x, float):
        return None if (x != x or math.isinf(x)) else x
    if isinstance(x, dict):
        return {str(k): json_safe(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_safe(v) for v in x]
    return x


def summarize(records: Sequence[RequestRecord], wall_s: float, slo: Slo) -> dict[str, Any]:
    """Latency percentiles, throughputs, goodput, per-request acceptance and outcome counts."""
    out: dict[str, Any] = {"n_requests": len(records)}
    for status in ("ok", "timeout", "error", "oom", "cut"):
        out[f"n_{status}"] = sum(1 for r in records if r.status == status)
    out["wall_s"] = wall_s
    out.update(metrics.latency_summary(records))
    out["request_throughput_rps"] = metrics.request_throughput(records)
    out["output_throughput_tps"] = metrics.output_throughput(records)
    out["goodput_rps"] = metrics.goodput(records, ttft_s=slo.ttft_s, tpot_s=slo.tpot_s, e2e_s=slo.e2e_s)
    out["slo"] = {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2e_s": slo.e2e_s}
    out["acceptance_per_request"] = metrics.acceptance_summary(records)
    return out


def compare(baseline: Sequence[RequestRecord], spec: Sequence[RequestRecord]) -> dict[str, Any]:
    """Paired speedup (E2E, its interval over prompts) and throughput / TTFT / TPOT ratios at one load point."""
    out: dict[str, Any] = dict(metrics.paired_speedup(baseline, spec))
    out["exact_match_rate"] = metrics.exact_match_rate(baseline, spec)
    b, s = metrics.latency_summary(baseline), metrics.latency_summary(spec)
    tb, ts = metrics.output_throughput(baseline), metrics.output_throughput(spec)
    out["output_throughput_ratio"] = ts / tb if tb and tb == tb and ts == ts else metrics.NAN
    for k in ("ttft_s_p50", "tpot_s_p50", "e2e_s_p50"):
        out[f"{k}_ratio_base_over_spec"] = b[k] / s[k] if s[k] and s[k] == s[k] and b[k] == b[k] else metrics.NAN
    return out


def stops_paying(comparisons: Sequence[tuple[float, dict[str, Any]]]) -> float | None:
    """The lowest rate whose paired speedup is ≤ 1 (speculation no longer pays); None if none."""
    for rate, c in sorted(comparisons, key=lambda rc: rc[0]):
        sp = c.get("speedup")
        if sp is not None and sp == sp and sp <= 1.0:
            return rate
    return None


# --------------------------------------------------------------------------------------------
# the sweep
