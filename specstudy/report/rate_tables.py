"""A study's serving frames as the report prints them: the request-rate sweep, where speculation
stops paying, and the prefix cache off against on.  The frames come from
:mod:`specstudy.analysis.rates`; only their wording (and the stops-paying reading of the sweep) is
made here."""

from __future__ import annotations

import math

import pandas as pd

from .. import metrics
from ..analysis.rates import with_arrivals
from ..analysis.serving import stops_paying
from .format import fmt
from .strata_tables import method_name, method_names


def _ms(v: float) -> str:
    return fmt(v * 1e3 if v == v else metrics.NAN, 1)


def _cache_text(p: bool | None) -> str:
    return "unknown" if p is None else ("on" if p else "off")


def _rate_text(r: float) -> str:
    return "inf" if math.isinf(r) else f"{r:g}"


def rate_table(raw: pd.DataFrame) -> pd.DataFrame:
    """The sweep as a reader sees it: one row per (framework, method, rate, arrivals)."""
    if raw.empty:
        return raw
    out = with_arrivals(raw).sort_values(
        ["framework", "task", "prefix_cache", "method", "label", "gamma", "rate", "arrivals"], na_position="first"
    )
    return pd.DataFrame(
        {
            "Framework": out["framework"],
            "Method": method_names(out["label"], out["gamma"], out.get("flagged", [""] * len(out))),
            "Task": out["task"],
            "Prefix cache": [_cache_text(p) for p in out["prefix_cache"]],
            "Rate (req/s)": [_rate_text(r) for r in out["rate"]],
            "Arrivals": out["arrivals"],
            "ok / n": [
                f"{o}/{n}" + (f" ({c:g} cut)" if c else "")
                for o, n, c in zip(out["ok"], out["n"], out["cut"] if "cut" in out else [0] * len(out))
            ],
            "req/s": [fmt(v, 2) for v in out["request_throughput_rps"]],
            "Output tok/s": [fmt(v, 1) for v in out["output_throughput_tps"]],
            "TTFT p50 / p99 ms": [f"{_ms(a)} / {_ms(b)}" for a, b in zip(out["ttft_p50_s"], out["ttft_p99_s"])],
            "TPOT p50 / p99 ms": [f"{_ms(a)} / {_ms(b)}" for a, b in zip(out["tpot_p50_s"], out["tpot_p99_s"])],
            "Goodput (req/s)": [fmt(v, 2) for v in out["goodput_rps"]],
            "Mean running batch": [fmt(v, 2) for v in out["mean_running"]],
            "Speedup vs AR": [fmt(v, 2, "×") for v in out["speedup"]],
            "Send lag p50 / max ms": [
                f"{fmt(a, 2)} / {fmt(b, 2)}" for a, b in zip(out["send_lag_p50_ms"], out["send_lag_max_ms"])
            ],
            "Peak memory MB": [fmt(v / 1e6 if v == v else metrics.NAN, 0) for v in out["peak_memory_bytes"]],
        }
    ).reset_index(drop=True)


def stops_paying_table(raw: pd.DataFrame) -> pd.DataFrame:
    """Per framework and speculative method: the lowest offered rate whose paired speedup is ≤ 1, from
    unflagged cells only (how many were left out is said)."""
    rows = []
    # a rate sweep's cells: a trace replay is one load pattern, not a point of the sweep
    raw = with_arrivals(raw)
    left = raw[raw["flagged"].astype(bool)] if "flagged" in raw else raw.iloc[0:0]
    raw = raw.drop(left.index)
    spec = raw[(raw["method"] != "ar") & (raw["arrivals"] != "trace")] if not raw.empty else raw
    keys = ["framework", "label", "gamma", "task", "prefix_cache"]
    for (fw, label, gamma, task, cache), g in spec.groupby(keys, dropna=False) if len(spec) else []:
        pairs = [(float(r), {"speedup": float(s)}) for r, s in zip(g["rate"], g["speedup"])]
        stop = stops_paying(pairs)
        measured = ", ".join(
            f"{_rate_text(r)}: {fmt(s['speedup'], 2, '×')}" for r, s in sorted(pairs, key=lambda p: p[0])
        )
        rows.append(
            {
                "Framework": fw,
                "Method": method_name(label, gamma),
                "Task": task,
                "Prefix cache": _cache_text(cache),
                "Stops paying at (req/s)": "does not, up to the highest rate run" if stop is None else _rate_text(stop),
                "Speedup per rate": measured,
                "Flagged rates left out": ", ".join(
                    _rate_text(float(r))
                    for r in left.loc[
                        (left["framework"] == fw) & (left["label"] == label) & (left["task"] == task), "rate"
                    ]
                )
                or "—",
            }
        )
    return pd.DataFrame(rows)


def prefix_cache_table(raw: pd.DataFrame) -> pd.DataFrame:
    if raw.empty:
        return raw
    out = raw.assign(_rate=raw["rate"].fillna(-1.0)).sort_values(
        ["framework", "label", "gamma", "task", "batch_size", "_rate", "prefix_cache"], na_position="first"
    )
    return pd.DataFrame(
        {
            "Framework": out["framework"],
            "Method": [method_name(lab, g) for lab, g in zip(out["label"], out["gamma"])],
            "Task": out["task"],
            "Batch": out["batch_size"],
            "Rate (req/s)": [_rate_text(r) if r is not None and r == r else "— (batch)" for r in out["rate"]],
            "Prefix cache": [_cache_text(p) for p in out["prefix_cache"]],
            "Lookups (tokens)": [fmt(v) if v is not None else "—" for v in out["queries_tokens"]],
            "Hits (tokens)": [fmt(v) if v is not None else "—" for v in out["hits_tokens"]],
            "Hit rate": [fmt(v, 3) if v is not None and v == v else "—" for v in out["hit_rate"]],
            "TTFT p50 ms": [fmt(v * 1e3 if v == v else metrics.NAN, 1) for v in out["ttft_p50_s"]],
            "E2E p50 ms": [fmt(v * 1e3 if v == v else metrics.NAN, 1) for v in out["e2e_p50_s"]],
            "n": out["n"],
        }
    ).reset_index(drop=True)
