"""One cell: untimed warm-up, the measured requests under telemetry, the records stamped with the plan.

An offline cell decodes its prompts through ``backend.run`` in batches of the cell's size; a
request-rate cell offers them to a server through the one serving driver
(:func:`specstudy.run.serving_driver.serve`).  Either way the records come back stamped with the plan's
axes (label, family, sweeps, baseline, prefix cache, rate) as their own columns.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .. import metrics
from ..backends.base import Backend, ServingBackend
from ..backends.loadgen import CutRule
from ..records import Request, RequestRecord, Sampling, cut_short
from ..telemetry import Telemetry, TelemetrySampler, load_average
from .plan import CellPlan
from .serving_driver import Load, serve

#: bounds of one serving cell (a server that stops answering must not hang the study)
RATE_REQUEST_TIMEOUT_S = 600.0
RATE_RUN_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class CellRun:
    """One cell's run as the runner hands it on (offline, at a rate, turn by turn): the plan, the
    engine, the measured requests and the untimed warm-up, and how the run is watched."""

    plan: CellPlan
    backend: Backend
    requests: Sequence[Request]
    warmup: Sequence[Request] = ()
    warmup_tokens: int = 0  # new tokens of each warm-up request (0: the plan's own)
    telemetry_period_s: float = 0.5
    progress: bool = True
    cut: CutRule | None = None  # a capacity probe stops once its verdict is decided


@dataclass
class CellResult:
    """What the one progress line of a cell says."""

    cell_id: str
    label: str
    status: str  # "done", "skipped", "failed"
    requests: int = 0
    ok: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0
    tokens_per_s: float = float("nan")
    alpha: float | None = None
    acceptance_length: float | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    load_1m: float = float("nan")
    throttled: bool = False
    message: str = ""
    sweeps: tuple[str, ...] = ()
    note: str = ""  # what the validity checks found while running it (stalls, a rerun)

    def line(self, i: int, total: int) -> str:
        head = f"[{i}/{total}] {self.cell_id}"
        if self.status == "skipped":
            return f"{head}: done earlier, skipped"
        if self.status == "failed":
            return f"{head}: FAILED: {self.message}"
        parts = [
            f"{self.ok}/{self.requests} ok",
            f"{self.output_tokens} tok in {self.wall_s:.1f}s",
            f"{self.tokens_per_s:.1f} tok/s",
        ]
        if self.alpha is not None and self.alpha == self.alpha:
            al = self.acceptance_length
            parts.append(
                f"alpha {self.alpha:.2f} AL {al:.2f}" if al is not None and al == al else f"alpha {self.alpha:.2f}"
            )
        if self.speedup is not None and self.speedup == self.speedup:
            lo, hi = self.speedup_ci or (float("nan"), float("nan"))
            parts.append(f"speedup {self.speedup:.2f}x [{lo:.2f}, {hi:.2f}]")
        parts.append(f"load {self.load_1m:.2f}")
        if self.throttled:
            parts.append("THROTTLED")
        if self.note:
            parts.append(self.note)
        return f"{head}: " + ", ".join(parts)


def split_warmup(requests: Sequence[Request], n: int, warmup: int) -> tuple[list[Request], list[Request]]:
    """The first ``n`` requests are measured; the next ``warmup`` (cycled if short) warm the engine up."""
    measured = list(requests[:n])
    rest = list(requests[n:]) or list(requests)
    warm = [dataclasses.replace(rest[i % len(rest)], prompt_id=f"warmup-{i}") for i in range(warmup)] if rest else []
    return measured, warm


def warmup_sampling(plan: CellPlan, warmup_tokens: int) -> Sampling:
    """The cell's sampling, capped at the warm-up length (untimed requests, discarded)."""
    return dataclasses.replace(plan.sampling, max_new_tokens=min(warmup_tokens, plan.sampling.max_new_tokens))


def _progress(total: int, desc: str, enabled: bool) -> Any:
    from tqdm.auto import tqdm

    return tqdm(
        total=total, desc=desc, unit="req", leave=False, disable=not enabled, file=sys.stderr, dynamic_ncols=True
    )


def stamp_request(plan: CellPlan, rec: RequestRecord, by_id: dict[str, Request]) -> RequestRecord:
    """The plan's identity, the request's input policy and output constraint (what judges its output
    valid), and the load average at its end."""
    l1, l5, l15 = load_average()
    req = by_id.get(rec.prompt_id)
    rec.input_policy = rec.input_policy or getattr(req, "input_policy", "") or ""
    rec.extra = {**(rec.extra or {}), "load_1m": l1, "load_5m": l5, "load_15m": l15}
    if req is not None and (req.json_schema or req.grammar):
        rec.extra["constraint"] = {"json_schema": req.json_schema, "grammar": req.grammar}
    return plan.stamp(rec)


def run_offline(run: CellRun) -> tuple[list[RequestRecord], Telemetry]:
    """Warm up (untimed, discarded), then decode the requests in batches under telemetry."""
    plan, backend, requests = run.plan, run.backend, run.requests
    cell = plan.backend_cell()
    if run.warmup:
        for _ in backend.run(list(run.warmup), warmup_sampling(plan, run.warmup_tokens), cell):
            pass
    policies = {r.prompt_id: r for r in requests}
    records: list[RequestRecord] = []
    tokens = 0
    c = plan.cell
    bar = _progress(len(requests), f"{plan.label} {c.task} γ={c.gamma or '-'} b={c.batch_size}", run.progress)
    sampler = TelemetrySampler(run.telemetry_period_s).start()
    t0 = time.perf_counter()
    try:
        for rec in backend.run(list(requests), plan.sampling, cell):
            records.append(stamp_request(plan, rec, policies))
            tokens += rec.output_tokens if rec.status == "ok" else 0
            bar.update(1)
            bar.set_postfix_str(f"{tokens / max(time.perf_counter() - t0, 1e-9):.1f} tok/s")
    finally:
        tel = sampler.stop()
        bar.close()
    return records, tel


def run_at_rate(run: CellRun) -> tuple[list[RequestRecord], Telemetry]:
    """A serving cell against the cell's server: Poisson arrivals at ``plan.request_rate``, or the
    trace task's recorded arrivals (``plan.arrivals == "trace"``)."""
    plan, backend, requests = run.plan, run.backend, run.requests
    if not isinstance(backend, ServingBackend):
        raise ValueError(
            f"request_rate needs a server backend (vllm-server, sglang, llamacpp, openai); "
            f"{type(backend).__name__} decodes offline batches"
        )
    assert plan.request_rate is not None
    offsets: list[float] | None = None
    if plan.arrivals == "trace":
        recorded = [r.arrival_s for r in requests]
        if any(t is None for t in recorded):
            raise ValueError(f"cell {plan.cell_id}: arrivals trace needs requests from a trace task")
        t0 = min(t for t in recorded if t is not None)
        offsets = [t - t0 for t in recorded if t is not None]  # a later slice of the trace starts at once
    served = serve(
        backend,
        requests,
        run.warmup,
        plan.sampling,
        warmup_sampling(plan, run.warmup_tokens),
        plan.backend_cell(),
        Load(plan.request_rate),
        request_timeout_s=RATE_REQUEST_TIMEOUT_S,
        run_timeout_s=RATE_RUN_TIMEOUT_S,
        telemetry_period_s=run.telemetry_period_s,
        seed=plan.sampling.seed,
        offsets=offsets,
        cut=run.cut,
    )
    policies = {r.prompt_id: r for r in requests}
    for rec in served.records:
        stamp_request(plan, rec, policies).extra.update(run_wall_s=served.wall_s, run_acceptance=served.run_acceptance)
    return served.records, served.telemetry


def run_cell(run: CellRun) -> tuple[list[RequestRecord], Telemetry]:
    """The cell's records and telemetry, offline or at its request rate."""
    return run_at_rate(run) if run.plan.request_rate is not None else run_offline(run)


def annotate(
    records: list[RequestRecord],
    warmup: int,
    wall_s: float,
    tel_summary: dict[str, Any],
    warmup_tokens: int = 0,
    *,
    engine_warmed_itself: bool = False,
) -> None:
    """The cell's measurement conditions on each record: warm-up, wall time, telemetry summary."""
    keep = {k: v for k, v in tel_summary.items() if not isinstance(v, list)}
    for r in records:
        r.extra.update(
            warmup_requests=warmup,
            warmup_max_new_tokens=warmup_tokens,
            engine_warmed_itself=engine_warmed_itself,
            warmup_scope="engine, method, gamma, batch size, options, sampling, output length, prefix cache, served, input length",
            cell_wall_s=wall_s,
            throttle_reasons=tel_summary.get("gpu_throttle_reasons", []),
            **{f"tel_{k}": v for k, v in keep.items()},
        )


def summarize(
    plan: CellPlan,
    records: list[RequestRecord],
    wall_s: float,
    baseline: list[RequestRecord] | None,
    tel_summary: dict[str, Any],
) -> CellResult:
    """The cell's progress line: throughput, acceptance and (when paired) its speedup."""
    ok = [r for r in records if r.status == "ok"]
    acc = metrics.acceptance_summary(records)
    res = CellResult(
        cell_id=plan.cell_id,
        label=plan.label,
        status="done",
        requests=len(records),
        ok=len(ok),
        output_tokens=sum(r.output_tokens for r in ok),
        wall_s=wall_s,
        tokens_per_s=metrics.output_throughput(records),
        alpha=acc["alpha"],
        acceptance_length=acc["acceptance_length"],
        load_1m=load_average()[0],
        throttled=bool(tel_summary.get("throttled")),
        sweeps=plan.sweeps,
    )
    errors = sorted({f"{r.status}: {r.error}"[:120] for r in records if r.status != "ok"})
    if errors:
        res.message = "; ".join(errors[:3])
    if baseline is not None and not cut_short([*records, *baseline]):
        sp = metrics.paired_speedup(baseline, records)
        res.speedup, res.speedup_ci = sp["speedup"], (sp["ci_low"], sp["ci_high"])
    return res
