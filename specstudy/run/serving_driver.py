"""The one serving driver: requests offered at a rate against a server, on schedule.

A *serving run* is one method at one load point: warm-up requests (not recorded), a scrape of
the server's counters, the timed requests under the telemetry sampler, another scrape, so
acceptance is scoped to exactly this run.  The study runner's request-rate cells and
``specstudy serve-bench`` both call :func:`serve`.  Every request has a deadline and the run has
one: requests the run deadline leaves unsent become ``timeout`` records, so a sweep never hangs.

Arrivals: inter-arrival gaps ~ Gamma(shape=b, scale=1/(λ·b)); b = 1 is a Poisson process,
b < 1 is burstier, b > 1 smoother (the convention of vLLM's ``benchmark_serving``).  λ = inf
sends everything at once; ``concurrency`` then means a closed loop of that many clients, and
with finite λ it caps the requests in flight.  The sends themselves are the load generator's
(:mod:`specstudy.backends.loadgen`: one asyncio client, each request's scheduled and actual send
time in its record).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.serving import compare, json_safe, stops_paying, summarize
from ..backends.base import ServingBackend
from ..backends.lifecycle import ServerStartError
from ..backends.loadgen import AsyncSender, CutRule, Offer, offer
from ..backends.server_base import ServerDied
from ..config.schema import Slo
from ..records import Cell, Request, RequestRecord, Sampling, write_part
from ..telemetry import Telemetry, TelemetrySampler

INF = float("inf")


def parse_rates(text: str) -> list[float]:
    """``"0.5,1,inf"`` → [0.5, 1.0, inf]; rates must be > 0."""
    rates = []
    for part in str(text).split(","):
        part = part.strip().lower()
        if not part:
            continue
        try:
            r = INF if part in ("inf", "infinity") else float(part)
        except ValueError:
            raise ValueError(f"rates: {part!r} is not a number; give requests/s like 0.5,1,inf") from None
        if not r > 0:
            raise ValueError(f"rates: {part!r} must be > 0 requests/s (or inf)")
        rates.append(r)
    if not rates:
        raise ValueError(f"rates={text!r}: give at least one rate, e.g. 0.5,1,inf")
    return rates


def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send times (seconds from the run start) of ``n`` requests; the first at 0."""
    if n < 0:
        raise ValueError(f"n={n!r}: must be >= 0")
    if not rate > 0:
        raise ValueError(f"rate={rate!r}: must be > 0")
    if not burstiness > 0:
        raise ValueError(f"burstiness={burstiness!r}: must be > 0 (1 = Poisson)")
    if n == 0:
        return []
    if math.isinf(rate):
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    offsets: list[float] = np.cumsum(gaps).tolist()
    return [0.0] + offsets


@dataclass(frozen=True)
class Load:
    """One load point: requests/s, burstiness, and the concurrency cap (None = unbounded)."""

    rate: float
    burstiness: float = 1.0
    concurrency: int | None = None

    def __post_init__(self) -> None:
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"concurrency={self.concurrency!r}: must be >= 1")

    @property
    def label(self) -> str:
        r = "inf" if math.isinf(self.rate) else f"{self.rate:g}"
        return f"rate={r}" + (f",conc={self.concurrency}" if self.concurrency else "")

    def options(self) -> tuple[tuple[str, Any], ...]:
        return (
            ("rate", "inf" if math.isinf(self.rate) else self.rate),
            ("burstiness", self.burstiness),
            ("concurrency", self.concurrency),
        )


def drive(
    sender: AsyncSender,
    requests: Sequence[Request],
    sampling: Sampling,
    cell: Cell,
    load: Load,
    *,
    request_timeout_s: float,
    run_timeout_s: float,
    seed: int = 0,
) -> tuple[list[RequestRecord], float]:
    """Offer ``requests`` at ``load`` through the load generator (:mod:`specstudy.backends.loadgen`).

    Returns the records in request order and the run's wall time.  No request gets more time
    than is left of ``run_timeout_s``; requests not sent by then are ``timeout`` records.
    """
    offsets = arrival_offsets(len(requests), load.rate, load.burstiness, seed)
    return offer(
        sender, Offer(list(requests), sampling, cell, offsets, load.concurrency, request_timeout_s, run_timeout_s)
    )


@dataclass
class ServedRun:
    """What one serving run produced: its records, wall time, telemetry and run-scoped acceptance."""

    records: list[RequestRecord]
    wall_s: float
    telemetry: Telemetry
    run_acceptance: dict[str, Any] | None
    warmup_ok: int = 0
    warmup_n: int = 0


def serve(
    backend: ServingBackend,
    requests: Sequence[Request],
    warmup: Sequence[Request],
    sampling: Sampling,
    warmup_sampling: Sampling,
    cell: Cell,
    load: Load,
    *,
    request_timeout_s: float,
    run_timeout_s: float,
    telemetry_period_s: float,
    seed: int = 0,
    offsets: Sequence[float] | None = None,
    cut: CutRule | None = None,
) -> ServedRun:
    """Start (or attach to) the cell's server, warm it up, then offer ``requests`` at ``load``
    (or at ``offsets``, seconds from the run's start: a trace's recorded arrivals); with ``cut``, only
    until the run has broken its SLO whatever its other requests do.

    Raises :class:`~specstudy.backends.server_base.ServerDied` (with the run's records) when the
    server exits during the run.
    """
    backend.ensure_server(cell)
    warm = [backend.send(r, warmup_sampling, cell, request_timeout_s) for r in warmup]
    sampler = TelemetrySampler(telemetry_period_s).start()
    try:
        sends = (
            list(offsets) if offsets is not None else arrival_offsets(len(requests), load.rate, load.burstiness, seed)
        )
        batch = backend.offer_run(
            Offer(list(requests), sampling, cell, sends, load.concurrency, request_timeout_s, run_timeout_s, cut)
        )
    finally:
        tel = sampler.stop()
    records, wall, run_acc = batch.records, batch.wall_s, batch.run_acceptance
    for rec in records:  # the same run-level block on every record of the run: NOT a per-request number
        rec.extra["run_scope"] = {"acceptance": run_acc, "n_requests": len(records), "wall_s": wall, "load": load.label}
        rec.extra["arrivals"] = "trace" if offsets is not None else "poisson"
    return ServedRun(records, wall, tel, run_acc, sum(1 for w in warm if w.status == "ok"), len(warm))


@dataclass
class SweepConfig:
    spec_method: str
    gamma: int | None
    rates: list[float]
    burstiness: float = 1.0
    concurrency: int | None = None
    warmup: int = 2
    request_timeout_s: float = 120.0
    run_timeout_s: float = 1800.0
    slo: Slo = field(default_factory=Slo)
    baseline: bool = True
    seed: int = 0
    method_options: tuple[tuple[str, Any], ...] = ()
    telemetry_period_s: float = 0.5


def run_sweep(
    backends: dict[str, Any],
    requests: Sequence[Request],
    warmup_requests: Sequence[Request],
    sampling: Sampling,
    base_cell: Cell,
    cfg: SweepConfig,
    out_dir: str | Path,
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Run every rate with the speculative method and (if ``cfg.baseline``) with ``ar``.

    ``backends`` maps ``"spec"`` / ``"baseline"`` to server backends (they may be the same
    object: it restarts its server per configuration).  Returns the summary (also written as
    ``summary.json`` next to ``records/``).
    """
    out_dir = Path(out_dir)
    arms = [("spec", cfg.spec_method, cfg.gamma)]
    if cfg.baseline:
        arms.insert(0, ("baseline", "ar", None))
    runs: dict[str, dict[float, list[RequestRecord]]] = {}
    summary: dict[str, Any] = {
        "sampling": sampling.__dict__,
        "config": {
            "spec_method": cfg.spec_method,
            "gamma": cfg.gamma,
            "rates": ["inf" if math.isinf(r) else r for r in cfg.rates],
            "burstiness": cfg.burstiness,
            "concurrency": cfg.concurrency,
            "warmup": cfg.warmup,
            "request_timeout_s": cfg.request_timeout_s,
            "run_timeout_s": cfg.run_timeout_s,
            "n_requests": len(requests),
            "method_options": dict(cfg.method_options),
        },
        "servers": {},
        "runs": [],
    }
    for arm, method, gamma in arms:
        backend = backends[arm]
        runs[arm] = {}
        for rate in cfg.rates:
            load = Load(rate, cfg.burstiness, cfg.concurrency)
            opts = tuple(cfg.method_options) + load.options() if method != "ar" else load.options()
            cell = replace(base_cell, method=method, gamma=gamma, options=opts)
            progress(
                f"[serve-bench] {arm} ({method}) {load.label}: warm-up {len(warmup_requests)}, {len(requests)} requests"
            )
            try:
                run = serve(
                    backend,
                    requests,
                    warmup_requests,
                    sampling,
                    sampling,
                    cell,
                    load,
                    request_timeout_s=cfg.request_timeout_s,
                    run_timeout_s=cfg.run_timeout_s,
                    telemetry_period_s=cfg.telemetry_period_s,
                    seed=cfg.seed,
                )
            except (ServerStartError, ServerDied) as e:  # recorded; the other arm's results are kept
                summary.setdefault("errors", []).append({"arm": arm, "method": method, "error": str(e)[-4000:]})
                progress(f"[serve-bench] {arm} ({method}): server failed: {str(e)[:500]}")
                break
            summary["servers"][arm] = backend.server_info.as_dict() if getattr(backend, "server_info", None) else {}
            # peak memory is the server watch's (process tree RSS, NVML per GPU), set by offer_run
            records, wall, tele = run.records, run.wall_s, run.telemetry.summary()
            part = write_part(records, out_dir / "records" / f"{cell.cell_id}.parquet")
            s = summarize(records, wall, cfg.slo)
            s.update(
                arm=arm,
                method=method,
                gamma=gamma,
                rate="inf" if math.isinf(rate) else rate,
                load=load.label,
                cell_id=cell.cell_id,
                records=str(part),
                run_acceptance=run.run_acceptance,
                telemetry=tele,
                warmup={"n": run.warmup_n, "n_ok": run.warmup_ok},
            )
            summary["runs"].append(s)
            runs[arm][rate] = records
            progress(
                f"[serve-bench]   ok {s['n_ok']}/{s['n_requests']}  out {s['output_throughput_tps']:.2f} tok/s  "
                f"TTFT p50 {s['ttft_s_p50']:.3f} s  TPOT p50 {s['tpot_s_p50']:.4f} s"
            )
        if arm == "baseline" and backends.get("spec") is not backend:
            backend.stop_server()
    comparisons = []
    if cfg.baseline:
        for rate in cfg.rates:
            if rate not in runs.get("baseline", {}) or rate not in runs.get("spec", {}):
                continue
            c = compare(runs["baseline"][rate], runs["spec"][rate])
            c["rate"] = "inf" if math.isinf(rate) else rate
            comparisons.append((rate, c))
    summary["comparison"] = [c for _, c in comparisons]
    stop = stops_paying(comparisons)
    summary["stops_paying_at_rate"] = None if stop is None else ("inf" if math.isinf(stop) else stop)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "summary.json").write_text(json.dumps(json_safe(summary), indent=2, default=str))
    return summary
