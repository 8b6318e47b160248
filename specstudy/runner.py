"""Run the study matrix cell by cell: warm-up, paired AR baseline, repeats, records, resume.

One cell = one :class:`specstudy.study.CellPlan`: untimed warm-up requests, then the measured
prompts through ``backend.run``, telemetry sampled alongside, one parquet part written at the
end (temp name, then rename).  A rerun skips every cell whose part exists, so a killed study
loses at most the cell in flight and never duplicates records.  A cell that raises is reported
(``failed/<cell_id>.json``) and the others go on.  Engines are loaded once per
(framework, model, drafter) and reused across cells; the paired AR baseline of a speculative cell
runs on the same engine with the same prompts and sampling, just before it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
import traceback
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from . import metrics
from .records import Cell, Request, RequestRecord, read_part, write_part
from .study import DRAFTER_PER_CELL, SERVER_FRAMEWORKS, CellPlan, StudyConfig, plan_summary
from .telemetry import TelemetrySampler, load_average

RequestLoader = Callable[[str, int, int, Any], list[Request]]
BackendFactory = Callable[..., Any]


# --------------------------------------------------------------------------------------------
# output layout


def output_dir(hardware: str, root: str | os.PathLike = "outputs") -> Path:
    return Path(root) / hardware


def records_dir(out: Path) -> Path:
    return out / "records"


def part_path(out: Path, cell_id: str) -> Path:
    return records_dir(out) / f"{cell_id}.parquet"


def telemetry_path(out: Path, cell_id: str) -> Path:
    return out / "telemetry" / f"{cell_id}.parquet"


def failed_path(out: Path, cell_id: str) -> Path:
    return out / "failed" / f"{cell_id}.json"


def is_done(out: Path, cell_id: str) -> bool:
    return part_path(out, cell_id).exists()


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_plan(cfg: StudyConfig, plans: Sequence[CellPlan], out: Path) -> Path:
    """Snapshot the expanded matrix into ``study.json``: the report reads sweeps and pairing from it."""
    doc = {
        "study": cfg.name, "hardware": cfg.hardware, "file": cfg.file,
        "config": dataclasses.asdict(cfg),
        "summary": plan_summary(plans, cfg.warmup_requests, cfg.warmup_max_new_tokens),
        "cells": [p.as_dict() for p in plans],
    }
    path = out / "study.json"
    _atomic_write_text(path, json.dumps(doc, indent=1, default=str))
    return path


# --------------------------------------------------------------------------------------------
# engines


def _default_factory(framework: str, **options: Any):
    from .backends import get_backend

    return get_backend(framework, **options)


class BackendPool:
    """Loaded engines keyed by :meth:`CellPlan.backend_key`, reused across cells.

    A cell without a drafter (AR, n-gram, layer skip) reuses any loaded in-process engine of the
    same target, since the reference engine picks the method per cell.  Servers hold one engine
    at a time (GPU memory); in-process engines up to ``capacity``, least recently used evicted.
    """

    def __init__(self, cfg: StudyConfig, factory: BackendFactory | None = None, capacity: int = 3,
                 log: Callable[[str], None] = print) -> None:
        self.cfg = cfg
        self.factory = factory or _default_factory
        self.capacity = capacity
        self.log = log
        self.loaded: OrderedDict[tuple, Any] = OrderedDict()
        self.loads: list[tuple] = []  # every key loaded, in order (tests check "once per key")

    def _options(self, plan: CellPlan) -> dict[str, Any]:
        fw = plan.cell.framework
        opts: dict[str, Any] = dict(self.cfg.framework_options.get(fw, {}))
        # engines that load each cell's drafter themselves start without one
        opts.update(model=plan.target, drafter=None if fw in DRAFTER_PER_CELL else plan.drafter_id)
        if plan.dtype != "auto":
            opts["dtype"] = plan.dtype
        if fw in ("reference", "hf"):
            opts["device"] = self.cfg.device
        if fw in SERVER_FRAMEWORKS:
            opts["prefix_cache"] = plan.prefix_cache
        tp = plan.tensor_parallel_size
        if tp > 1:  # multi-GPU is the engine's job: pass its own tensor-parallel setting
            if fw == "vllm":
                opts["tensor_parallel_size"] = tp
            elif fw == "vllm-server":
                opts["server_args"] = [*opts.get("server_args", []), "--tensor-parallel-size", str(tp)]
            elif fw == "sglang":
                opts["server_args"] = [*opts.get("server_args", []), "--tp-size", str(tp)]
            else:
                raise ValueError(f"framework {fw!r} has no tensor parallelism; tensor_parallel_size={tp} "
                                 "needs vllm, vllm-server or sglang")
        return opts

    def get(self, plan: CellPlan):
        key = plan.backend_key()
        if key in self.loaded:
            self.loaded.move_to_end(key)
            return self.loaded[key]
        fw = plan.cell.framework
        if plan.drafter_id is None:  # AR / n-gram / layer skip: any engine of this target will do
            for k in reversed(self.loaded):
                if k[0] == key[0] and k[1] == key[1] and k[3:] == key[3:]:  # same all but the drafter
                    self.loaded.move_to_end(k)
                    return self.loaded[k]
        cap = 1 if fw in SERVER_FRAMEWORKS else self.capacity
        while self.loaded and (len(self.loaded) >= cap or fw in SERVER_FRAMEWORKS
                               or any(k[0] in SERVER_FRAMEWORKS for k in self.loaded)):
            self._evict()
        t0 = time.perf_counter()
        backend = self.factory(fw, **self._options(plan))
        self.loads.append(key)
        self.loaded[key] = backend
        self.log(f"loaded {fw} engine: model={plan.target} drafter={plan.drafter_id} "
                 f"in {time.perf_counter() - t0:.1f}s")
        return backend

    def _evict(self) -> None:
        # prefer dropping an engine without a drafter: drafter-less cells can use any other
        victim = next((k for k in self.loaded if k[2] is None), next(iter(self.loaded)))
        b = self.loaded.pop(victim)
        with contextlib.suppress(Exception):
            b.close()

    def close(self) -> None:
        while self.loaded:
            _, b = self.loaded.popitem()
            with contextlib.suppress(Exception):
                b.close()


# --------------------------------------------------------------------------------------------
# prompts


def default_request_loader(task: str, n: int, seed: int, tokenizer: Any) -> list[Request]:
    from .tasks import load_requests

    return list(load_requests(task, n, seed, tokenizer))


def split_warmup(requests: Sequence[Request], n: int, warmup: int) -> tuple[list[Request], list[Request]]:
    """The first ``n`` requests are measured; the next ``warmup`` (cycled if short) warm the engine up."""
    measured = list(requests[:n])
    rest = list(requests[n:]) or list(requests)
    warm = [dataclasses.replace(rest[i % len(rest)], prompt_id=f"warmup-{i}") for i in range(warmup)] if rest else []
    return measured, warm


# --------------------------------------------------------------------------------------------
# one cell


@dataclass
class CellResult:
    cell_id: str
    label: str
    status: str  # "done", "skipped", "failed"
    requests: int = 0
    ok: int = 0
    output_tokens: int = 0
    wall_s: float = 0.0
    tokens_per_s: float = float("nan")
    alpha: float | None = None
    tau: float | None = None
    speedup: float | None = None
    speedup_ci: tuple[float, float] | None = None
    load_1m: float = float("nan")
    throttled: bool = False
    message: str = ""
    sweeps: tuple[str, ...] = ()

    def line(self, i: int, total: int) -> str:
        head = f"[{i}/{total}] {self.cell_id}"
        if self.status == "skipped":
            return f"{head}: done earlier, skipped"
        if self.status == "failed":
            return f"{head}: FAILED: {self.message}"
        parts = [f"{self.ok}/{self.requests} ok", f"{self.output_tokens} tok in {self.wall_s:.1f}s",
                 f"{self.tokens_per_s:.1f} tok/s"]
        if self.alpha is not None and self.alpha == self.alpha:
            parts.append(f"alpha {self.alpha:.2f} tau {self.tau:.2f}")
        if self.speedup is not None and self.speedup == self.speedup:
            lo, hi = self.speedup_ci or (float("nan"), float("nan"))
            parts.append(f"speedup {self.speedup:.2f}x [{lo:.2f}, {hi:.2f}]")
        parts.append(f"load {self.load_1m:.2f}")
        if self.throttled:
            parts.append("THROTTLED")
        return f"{head}: " + ", ".join(parts)


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="req", leave=False, disable=not enabled, file=sys.stderr,
                dynamic_ncols=True)


def _warmup_sampling(plan: CellPlan, warmup_tokens: int):
    """The cell's sampling, capped at the warm-up length (untimed requests, discarded)."""
    return dataclasses.replace(plan.sampling, max_new_tokens=min(warmup_tokens, plan.sampling.max_new_tokens))


def run_cell(plan: CellPlan, backend: Any, requests: Sequence[Request], warmup: Sequence[Request],
             warmup_tokens: int, telemetry_period_s: float, progress: bool = True) -> tuple[list[RequestRecord], Any]:
    """Warm up (untimed, discarded), then decode ``requests`` under telemetry; return records + telemetry."""
    cell: Cell = plan.backend_cell()
    if plan.request_rate is not None:
        return _run_at_rate(plan, backend, cell, requests, warmup, warmup_tokens, telemetry_period_s)
    if warmup:
        for _ in backend.run(list(warmup), _warmup_sampling(plan, warmup_tokens), cell):
            pass
    policies = {r.prompt_id: getattr(r, "input_policy", "") for r in requests}
    records: list[RequestRecord] = []
    tokens = 0
    c = plan.cell
    bar = _progress(len(requests), f"{plan.label} {c.task} γ={c.gamma or '-'} b={c.batch_size}", progress)
    sampler = TelemetrySampler(telemetry_period_s).start()
    t0 = time.perf_counter()
    try:
        for rec in backend.run(list(requests), plan.sampling, cell):
            l1, l5, l15 = load_average()
            rec.cell_id = plan.cell_id  # the study's full identity (run settings included)
            rec.input_policy = rec.input_policy or policies.get(rec.prompt_id) or ""
            rec.extra = {**(rec.extra or {}), "load_1m": l1, "load_5m": l5, "load_15m": l15}
            records.append(rec)
            tokens += rec.output_tokens if rec.status == "ok" else 0
            bar.update(1)
            bar.set_postfix_str(f"{tokens / max(time.perf_counter() - t0, 1e-9):.1f} tok/s")
    finally:
        tel = sampler.stop()
        bar.close()
    return records, tel


#: bounds of one serving cell (a server that stops answering must not hang the study)
RATE_REQUEST_TIMEOUT_S = 600.0
RATE_RUN_TIMEOUT_S = 3600.0


def _run_at_rate(plan: CellPlan, backend: Any, cell: Cell, requests: Sequence[Request], warmup: Sequence[Request],
                 warmup_tokens: int, telemetry_period_s: float) -> tuple[list[RequestRecord], Any]:
    """A serving cell: requests arrive as a Poisson process at ``plan.request_rate`` (the serving
    benchmark's driver), against a server started for this cell's speculative config; acceptance
    is scoped to the run from the server's counters before and after."""
    from .servebench import Load, drive

    for name in ("ensure_server", "send"):
        if not hasattr(backend, name):
            raise ValueError(f"request_rate needs a server backend (vllm-server, sglang, openai); "
                             f"{type(backend).__name__} has no {name}()")
    backend.ensure_server(cell)
    if warmup:
        warm_sampling = _warmup_sampling(plan, warmup_tokens)
        for r in warmup:
            backend.send(r, warm_sampling, cell, RATE_REQUEST_TIMEOUT_S)
    before = backend.scrape() if hasattr(backend, "scrape") else None
    sampler = TelemetrySampler(telemetry_period_s).start()
    try:
        records, wall = drive(backend.send, list(requests), plan.sampling, cell, Load(plan.request_rate),
                              request_timeout_s=RATE_REQUEST_TIMEOUT_S, run_timeout_s=RATE_RUN_TIMEOUT_S,
                              seed=plan.sampling.seed)
    finally:
        tel = sampler.stop()
    after = backend.scrape() if hasattr(backend, "scrape") else None
    run_acc = backend.run_acceptance(before, after, records) if hasattr(backend, "run_acceptance") else None
    policies = {r.prompt_id: getattr(r, "input_policy", "") for r in requests}
    for rec in records:
        l1, l5, l15 = load_average()
        rec.cell_id = plan.cell_id
        rec.input_policy = rec.input_policy or policies.get(rec.prompt_id) or ""
        rec.extra = {**(rec.extra or {}), "load_1m": l1, "load_5m": l5, "load_15m": l15, "run_wall_s": wall,
                     "run_acceptance": run_acc}
    return records, tel


def _annotate(records: list[RequestRecord], plan: CellPlan, warmup: int, wall_s: float, tel_summary: dict) -> None:
    """Everything the report needs to group and check a cell, in each record's ``extra``."""
    keep = {k: v for k, v in tel_summary.items() if not isinstance(v, list)}
    for r in records:
        r.extra.update(
            label=plan.label, sweeps=list(plan.sweeps), baseline_cell_id=plan.baseline_cell_id,
            warmup_requests=warmup, warmup_scope="engine, method, gamma, batch size", cell_wall_s=wall_s, prefix_cache=plan.prefix_cache,
            request_rate=plan.request_rate, cell_options={k: v for k, v in plan.cell.options},
            throttle_reasons=tel_summary.get("gpu_throttle_reasons", []),
            **{f"tel_{k}": v for k, v in keep.items()},
        )


def _summarize(plan: CellPlan, records: list[RequestRecord], wall_s: float, baseline: list[RequestRecord] | None,
               tel_summary: dict) -> CellResult:
    ok = [r for r in records if r.status == "ok"]
    acc = metrics.acceptance_summary(records)
    res = CellResult(
        cell_id=plan.cell_id, label=plan.label, status="done", requests=len(records), ok=len(ok),
        output_tokens=sum(r.output_tokens for r in ok), wall_s=wall_s,
        tokens_per_s=metrics.output_throughput(records), alpha=acc["alpha"], tau=acc["tau"],
        load_1m=load_average()[0], throttled=bool(tel_summary.get("throttled")), sweeps=plan.sweeps,
    )
    errors = sorted({f"{r.status}: {r.error}"[:120] for r in records if r.status != "ok"})
    if errors:
        res.message = "; ".join(errors[:3])
    if baseline is not None:
        sp = metrics.paired_speedup(baseline, records)
        res.speedup, res.speedup_ci = sp["speedup"], (sp["ci_low"], sp["ci_high"])
    return res


# --------------------------------------------------------------------------------------------
# the study


@contextlib.contextmanager
def study_lock(out: Path):
    """One runner per outputs folder: a second (``make -j``, two terminals) fails fast instead of racing."""
    import fcntl

    out.mkdir(parents=True, exist_ok=True)
    f = open(out / ".runner.lock", "w")
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another `specstudy run` is writing {out} (lock {out / '.runner.lock'})") from None
        f.write(str(os.getpid()))
        f.flush()
        yield
    finally:
        f.close()


def run_study(
    cfg: StudyConfig,
    plans: Sequence[CellPlan],
    out: str | os.PathLike,
    *,
    factory: BackendFactory | None = None,
    request_loader: RequestLoader | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    max_cells: int | None = None,
    full_plan: Sequence[CellPlan] | None = None,
) -> list[CellResult]:
    """Run every plan not already done; return one result per plan (done / skipped / failed).

    ``full_plan`` (default ``plans``) is what ``study.json`` records when only a subset is run,
    so the report keeps the other sweeps' records.
    """
    out = Path(out)
    loader = request_loader or default_request_loader
    results: list[CellResult] = []
    with study_lock(out):
        write_plan(cfg, full_plan if full_plan is not None else plans, out)
        _write_provenance(out)
        log_file = open(out / "run.log", "a")

        def say(msg: str) -> None:
            log(msg)
            log_file.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {msg}\n")
            log_file.flush()

        pool = BackendPool(cfg, factory, log=say)
        prompts_cache: dict[tuple, list[Request]] = {}
        baseline_cache: dict[str, list[RequestRecord]] = {}
        failed_engines: dict[tuple, str] = {}
        warmed: set[tuple] = set()
        todo = [p for p in plans if not is_done(out, p.cell_id)]
        say(f"study {cfg.name} on {cfg.hardware}: {len(plans)} cells, {len(plans) - len(todo)} done earlier, "
            f"{len(todo)} to run")
        ran = 0
        try:
            for i, plan in enumerate(plans, 1):
                if is_done(out, plan.cell_id):
                    results.append(CellResult(plan.cell_id, plan.label, "skipped", sweeps=plan.sweeps))
                    continue
                if max_cells is not None and ran >= max_cells:
                    break
                ran += 1
                res = _run_one(cfg, plan, out, pool, loader, prompts_cache, baseline_cache, failed_engines, progress,
                               warmed)
                results.append(res)
                say(res.line(i, len(plans)))
        finally:
            pool.close()
            failed = [r for r in results if r.status == "failed"]
            done = sum(r.status == "done" for r in results)
            say(f"study {cfg.name}: {done} cells run, {sum(r.status == 'skipped' for r in results)} skipped, "
                f"{len(failed)} failed")
            for r in failed:
                say(f"  FAILED {r.cell_id}: {r.message}")
            log_file.close()
    return results


def _run_one(cfg: StudyConfig, plan: CellPlan, out: Path, pool: BackendPool, loader: RequestLoader,
             prompts_cache: dict, baseline_cache: dict, failed_engines: dict, progress: bool,
             warmed: set) -> CellResult:
    key = plan.backend_key()
    try:
        if key in failed_engines:
            raise RuntimeError(f"engine failed to load earlier: {failed_engines[key]}")
        try:
            backend = pool.get(plan)
        except Exception as e:
            failed_engines[key] = f"{type(e).__name__}: {e}"
            raise
        tok = getattr(backend, "tokenizer", None)
        pkey = (plan.cell.task, plan.prompts + cfg.warmup_requests, plan.sampling.seed - plan.cell.repeat, plan.target)
        if pkey not in prompts_cache:
            prompts_cache[pkey] = loader(plan.cell.task, plan.prompts + cfg.warmup_requests,
                                         plan.sampling.seed - plan.cell.repeat, tok)
        requests, warm = split_warmup(prompts_cache[pkey], plan.prompts, cfg.warmup_requests)
        # warm-up is about the engine state (caches, allocator, JIT/graph capture for this shape):
        # once per (engine, method, γ, batch size, method options) in this process
        wkey = (key, plan.cell.method, plan.cell.gamma, plan.cell.batch_size, plan.method_options)
        if wkey in warmed:
            warm = []
        warmed.add(wkey)
        if not requests:
            raise RuntimeError(f"task {plan.cell.task!r} returned no prompts")
        t0 = time.perf_counter()
        records, tel = run_cell(plan, backend, requests, warm, cfg.warmup_max_new_tokens, cfg.telemetry_period_s, progress)
        wall = time.perf_counter() - t0
        if len(records) != len(requests):
            raise RuntimeError(f"backend returned {len(records)} records for {len(requests)} requests")
        summary = tel.summary()
        _annotate(records, plan, len(warm), wall, summary)
        if tel.samples:
            import pandas as pd

            tp = telemetry_path(out, plan.cell_id)
            tp.parent.mkdir(parents=True, exist_ok=True)
            tmp = tp.with_name(f".{tp.name}.{os.getpid()}.tmp")
            pd.DataFrame(tel.samples).assign(cell_id=plan.cell_id).to_parquet(tmp)
            os.replace(tmp, tp)
        write_part(records, part_path(out, plan.cell_id))  # the commit point of the cell
        with contextlib.suppress(FileNotFoundError):
            failed_path(out, plan.cell_id).unlink()
        baseline = None
        if plan.baseline_cell_id:
            baseline = baseline_cache.get(plan.baseline_cell_id)
            if baseline is None and is_done(out, plan.baseline_cell_id):
                baseline = read_part(part_path(out, plan.baseline_cell_id))
        else:
            baseline_cache[plan.cell_id] = records
        return _summarize(plan, records, wall, baseline, summary)
    except KeyboardInterrupt:
        raise
    except Exception as e:
        msg = f"{type(e).__name__}: {e}"
        _atomic_write_text(failed_path(out, plan.cell_id), json.dumps({
            "cell_id": plan.cell_id, "label": plan.label, "error": msg, "traceback": traceback.format_exc(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S"), "cell": plan.as_dict(),
        }, indent=1, default=str))
        return CellResult(plan.cell_id, plan.label, "failed", message=msg, sweeps=plan.sweeps)


def failed_cells(out: str | os.PathLike) -> list[dict[str, Any]]:
    """Cells whose last attempt failed and that have no records since."""
    out = Path(out)
    found = []
    for p in sorted((out / "failed").glob("*.json")):
        d = json.loads(p.read_text())
        if not is_done(out, d.get("cell_id", p.stem)):
            found.append(d)
    return found


def _write_provenance(out: Path) -> None:
    from .report import provenance

    path = out / "provenance.json"
    runs = []
    if path.exists():
        with contextlib.suppress(ValueError, OSError):
            runs = json.loads(path.read_text()).get("runs", [])
    runs.append(provenance())
    _atomic_write_text(path, json.dumps({"runs": runs}, indent=1, default=str))
