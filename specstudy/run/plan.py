"""The study's cells: the sweeps of a :class:`~specstudy.config.study_matrix.StudyConfig` expanded.

Every speculative cell is paired with the AR cell it is compared against (same prompts,
sampling, engine, batch size).  Cells shared by sweeps run once.  The order groups cells by
engine so models load once per framework/model/drafter, and puts each baseline before the cells
that need it.  :func:`check_backends` asks each framework's backend whether it runs the methods
the study gives it, and :func:`~specstudy.run.task_checks.check_tasks` reads every task file and
its prompts, both before any model loads.  A command calls :func:`load` once: the study with its task files parsed and its
matrix expanded (:class:`LoadedStudy`), which every later step reads.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import backends
from ..backends.base import Backend
from ..config import (
    ParamsError,
    StudyConfig,
    Sweep,
    hardware_names,
    load_hardware_profile,
    load_study,
)
from ..config.errors import ParamsProblems
from ..config.model_configs import config_problems
from ..config.schema import ModelPair
from ..data.conversations import turns_per_prompt
from ..data.traces import replay_rate
from ..frameworks import DECLARATIONS, drafter_per_cell, server_frameworks
from ..frameworks.declaration import LOAD_OPTIONS, CellCheck
from ..records import CONTROL_FAMILY, CONTROL_LABEL, Cell, RequestRecord, Sampling
from .task_checks import parsed_task


@dataclass(frozen=True)
class CellPlan:
    """One cell to run, with everything the runner needs and the id of its paired baseline."""

    cell: Cell
    sampling: Sampling
    prompts: int
    label: str
    target: str  # model id handed to the backend
    drafter_id: str | None  # drafter model id/path handed to the backend
    dtype: str
    tensor_parallel_size: int
    prefix_cache: bool
    request_rate: float | None
    baseline_cell_id: str | None  # None for AR cells
    family: str = ""  # method family (cell.method may be an engine-specific name such as eagle)
    method_options: tuple[tuple[str, Any], ...] = ()  # what the backend sees in cell.options
    sweeps: tuple[str, ...] = ()
    prompt_offset: int = 0  # a precision extension measures prompts [offset, offset + prompts) of the task
    arrivals: str = "poisson"  # a rate cell's arrivals: poisson at request_rate, or its trace task's recorded times
    turns: int = 1  # requests per prompt: a conversation's turns (at most; for sizing the study)

    @property
    def requests(self) -> int:
        """Requests the cell sends (its prompts times their turns, at most)."""
        return self.prompts * self.turns

    @property
    def cell_id(self) -> str:
        return self.cell.cell_id

    @property
    def is_baseline(self) -> bool:
        """An AR cell others pair with (an A/A control is AR paired with one: not a baseline)."""
        return self.cell.method == "ar" and self.baseline_cell_id is None

    def backend_key(self) -> tuple[Any, ...]:
        """Cells with the same key share one loaded engine (models loaded once per key).

        Server backends restart their server themselves when a cell's speculative config changes.
        """
        # the reference engine loads each cell's drafter itself (cached), so one engine per target
        drafter = None if self.cell.framework in drafter_per_cell() else self.drafter_id
        return (self.cell.framework, self.target, drafter, self.dtype, self.tensor_parallel_size, self.prefix_cache)

    def engine_config_key(self) -> tuple[Any, ...]:
        """Cells with the same key start the same engine configuration: for engines whose
        speculation is fixed at start (a server, vLLM's engine), the method, γ, drafter and method
        options (the offered load aside) too."""
        if self.cell.framework not in server_frameworks():
            return self.backend_key()
        opts = tuple(o for o in self.method_options if o[0] not in LOAD_OPTIONS)
        return (*self.backend_key(), self.cell.method, self.cell.gamma, self.drafter_id, opts)

    def warmup_key(self) -> tuple[Any, ...]:
        """What changes an engine's cost on first use, as far as the plan knows it: method, γ, batch
        size, method options (a grammar or any engine option among them), the sampling (vLLM and
        SGLang compile sampling kernels on first use), the output length, the prefix cache, and
        offline vs served.  The runner adds the prompts' input-length regime."""
        s = self.sampling
        return (
            self.cell.method,
            self.cell.gamma,
            self.cell.batch_size,
            self.method_options,
            (s.temperature, s.top_p, s.top_k),
            s.max_new_tokens,
            self.prefix_cache,
            self.request_rate is not None,
        )

    def cell_check(self, cuda: bool) -> CellCheck:
        """What the cell's backend checks before any model loads (``cuda``: the build the study uses)."""
        c = self.cell
        opts = dict(self.method_options)
        return CellCheck(c.method, c.gamma, opts, self.target, self.drafter_id, cuda, c.batch_size)

    def backend_cell(self) -> Cell:
        """The cell handed to ``backend.run``: method options only (plus the arrival rate for servers).

        The run settings that are part of the study's cell identity (max_new_tokens, prompts,
        label, ...) stay out of it; the cell keeps its one id, which the backend stamps on records.
        """
        opts = dict(self.method_options)
        if self.request_rate is not None:
            opts["rate"] = "inf" if math.isinf(self.request_rate) else self.request_rate
        return dataclasses.replace(self.cell, options=tuple(sorted(opts.items())))

    def stamp(self, record: RequestRecord) -> RequestRecord:
        """Write the plan's axes into a record's own columns (what the analysis groups by)."""
        record.cell_id = self.cell_id
        record.label, record.family, record.sweeps = self.label, self.family, list(self.sweeps)
        record.baseline_cell_id, record.request_rate, record.dtype = (
            self.baseline_cell_id,
            self.request_rate,
            self.dtype,
        )
        # the method's options, for readers that must know how it drafted (the golden gate leaves out
        # drafting that reads the clock)
        record.extra = {**(record.extra or {}), "method_options": dict(self.method_options)}
        # what the engine actually ran with: a server the kit did not start is unknown (None), never False
        record.prefix_cache = (
            record.extra.get("engine_prefix_cache", self.prefix_cache) if record.extra else self.prefix_cache
        )
        return record

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cell"] = dataclasses.asdict(self.cell)
        d["cell_id"] = self.cell_id
        return d


def backend_class(framework: str) -> type[Backend] | None:
    """The backend class of a framework (its module imported, no engine started); None if it needs its engine."""
    try:
        return backends.backend_class(framework)
    except ImportError:
        return None


def backend_methods(framework: str) -> tuple[str, ...] | None:
    """The methods a framework's declaration says it runs (None: not a known framework)."""
    return DECLARATIONS[framework].methods if framework in DECLARATIONS else None


def _structure(cfg: StudyConfig) -> None:
    """Each (framework, method) of a sweep must be one the backend runs; drafters must exist."""
    declared = {fw: backend_methods(fw) for sw in cfg.sweeps for fw in sw.frameworks}
    for sw in cfg.sweeps:
        if "trace" in sw.arrivals:
            _trace_checks(cfg, sw)
        for label in sw.methods:
            m = cfg.method(label)
            name = m.method or m.family
            for fw in sw.frameworks:
                ok = declared.get(fw)
                if ok is not None and name not in ok and (m.frameworks is None or fw in m.frameworks):
                    raise ParamsError(
                        cfg.file,
                        f"study.sweeps.{sw.name}.methods" if sw.name != "default" else "study.methods",
                        name,
                        sorted(ok),
                        f"framework {fw!r} does not run this method; restrict it with methods[].frameworks",
                    )
            if m.frameworks is not None and not set(sw.frameworks) & set(m.frameworks):
                raise ParamsError(
                    cfg.file,
                    f"study.sweeps.{sw.name}.frameworks",
                    list(sw.frameworks),
                    list(m.frameworks),
                    f"method {label!r} runs only on these",
                )
            if m.drafter is not None and not any(m.drafter in cfg.model(n).drafters for n in sw.models):
                raise ParamsError(
                    cfg.file,
                    f"study.sweeps.{sw.name}.models",
                    list(sw.models),
                    [p.name for p in cfg.models if m.drafter in p.drafters],
                    f"method {label!r} needs drafter {m.drafter!r}",
                )


def _trace_checks(cfg: StudyConfig, sw: Sweep) -> None:
    """A trace sweep runs on servers only, and every one of its tasks replays a trace file."""
    at = f"study.sweeps.{sw.name}" if sw.name != "default" else "study"
    offline = [fw for fw in sw.frameworks if fw not in server_frameworks()]
    if offline:
        raise ParamsError(
            cfg.file, f"{at}.frameworks", offline, list(server_frameworks()), "arrivals: trace needs servers"
        )
    for task in sw.tasks:
        try:
            replay_rate(parsed_task(cfg, task) or cfg.task(task), sw.prompts_per_task)
        except ParamsError as e:
            raise ParamsError(e.file, e.key, e.value, e.allowed, f"task {task!r} of {at}.tasks ({cfg.file})") from None


def uses_cuda(cfg: StudyConfig) -> bool:
    """Which engine build the study's profile means (the pinned versions differ: vLLM 0.33 on CUDA, 0.32 on CPU)."""
    if cfg.hardware in hardware_names():
        return load_hardware_profile(cfg.hardware, measure=False).kind == "gpu"
    return cfg.device.startswith("cuda")


def _cell_checks(cfg: StudyConfig, plans: Iterable[CellPlan]) -> None:
    """Every speculative cell through its backend's own check: pinned version, options, drafter files."""
    cuda, seen = uses_cuda(cfg), set()
    for p in plans:
        key = (
            p.cell.framework,
            p.cell.method,
            p.cell.gamma,
            p.method_options,
            p.drafter_id,
            p.target,
            p.cell.batch_size,
        )
        if key in seen:
            continue
        seen.add(key)
        cls = backend_class(p.cell.framework)
        if cls is None:
            continue
        try:
            cls.check_cell(p.cell_check(cuda))
        except (ValueError, FileNotFoundError) as e:
            where = next((s for s in p.sweeps), "default")
            raise ParamsError(
                cfg.file, f"study.methods[{p.label!r}] on {p.cell.framework} (sweep {where})", p.cell.method, str(e)
            ) from None


def check_backends(cfg: StudyConfig, files: bool = True, plans: Iterable[CellPlan] | None = None) -> StudyConfig:
    """The study against the backends it names: methods they run, then every cell through its backend's check.

    ``files=False`` skips the cell checks (they may hash model files): what a dry run needs on a
    machine without the weights.  ``plans``: the study's expanded cells (expanded here without them).
    """
    _structure(cfg)
    model_configs(cfg)
    if files:
        _cell_checks(cfg, expand(cfg) if plans is None else plans)
    return cfg


def model_configs(cfg: StudyConfig) -> None:
    """The study against each model's own config.json (context, tensor parallelism, drafts, memory per GPU),
    every problem at once; a model whose config is not here is named in a warning, not guessed."""
    memory = load_hardware_profile(cfg.hardware, measure=False).memory_gb if cfg.hardware in hardware_names() else None
    problems, unchecked = config_problems(cfg, memory if uses_cuda(cfg) else None)
    if unchecked and uses_cuda(cfg):
        warnings.warn(
            f"{cfg.file}: not checked against their own config.json (none here; `specstudy models configs "
            f"--hardware {cfg.hardware}` fetches them): {', '.join(unchecked)}",
            stacklevel=2,
        )
    if problems:
        raise ParamsProblems(problems, "study, against its models' own configs")


@dataclass(frozen=True)
class LoadedStudy:
    """A study validated once and carried through a command: its config (each task file parsed once,
    ``cfg.tasks``) and its plan (the matrix expanded once); no step after the load parses or expands again."""

    cfg: StudyConfig
    plans: tuple[CellPlan, ...]


def load(
    hardware: str, path: str | os.PathLike[str] | None = None, files: bool = True, allow_unused: bool = False
) -> LoadedStudy:
    """Load, expand and check a study against its backends (:func:`check_backends`), once
    (``allow_unused``: top-level entries no sweep uses are a warning, not an error)."""
    cfg = load_study(hardware, path, allow_unused=allow_unused)
    _structure(cfg)
    model_configs(cfg)
    plans = tuple(expand(cfg))
    if files:
        _cell_checks(cfg, plans)
    return LoadedStudy(cfg, plans)


def _run_options(
    s: Sampling, pair: ModelPair, prefix_cache: bool, rate: float | None, prompts: int
) -> tuple[tuple[str, Any], ...]:
    """Settings shared by a cell and its baseline: part of both identities."""
    opts = {
        "max_new_tokens": s.max_new_tokens,
        "prompts": prompts,
        "prefix_cache": prefix_cache,
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "ignore_eos": s.ignore_eos,
        "dtype": pair.dtype,
        "tp": pair.tensor_parallel_size,
    }
    if rate is not None:
        opts["request_rate"] = "inf" if math.isinf(rate) else rate
    return tuple(sorted(opts.items()))


def extension(plan: CellPlan, offset: int, count: int, baseline_cell_id: str | None = None) -> CellPlan:
    """The cell measuring the task's next ``count`` prompts from ``offset`` with everything else of ``plan``:
    a cell of its own (own id, own part), so a study that stops halfway keeps every finished extension."""
    opts = {**dict(plan.cell.options), "prompts": count, "prompt_offset": offset}
    cell = _with_id(dataclasses.replace(plan.cell, options=tuple(sorted(opts.items())), id=""))
    return dataclasses.replace(plan, cell=cell, prompts=count, prompt_offset=offset, baseline_cell_id=baseline_cell_id)


def _with_id(cell: Cell) -> Cell:
    """The cell with its one id fixed from its full identity (kept through :meth:`CellPlan.backend_cell`)."""
    return dataclasses.replace(cell, id=cell.identity_id())


def expand(cfg: StudyConfig) -> list[CellPlan]:
    """All cells of all sweeps, deduplicated, each speculative cell with its paired AR baseline.

    Order: grouped by engine (so models load once per framework/model/drafter), baselines
    before the speculative cells they pair with.
    """
    plans: dict[str, CellPlan] = {}
    sweeps_of: dict[str, set[str]] = {}
    turns = {t: turns_per_prompt(parsed_task(cfg, t)) for sw in cfg.sweeps for t in sw.tasks}  # each task read once
    rates: dict[tuple[str, int], float] = {}

    def add(plan: CellPlan, sweep: str) -> None:
        cid = plan.cell_id
        if cid not in plans:
            plans[cid] = plan
        sweeps_of.setdefault(cid, set()).add(sweep)

    for sw in cfg.sweeps:
        sweep_rates: tuple[float | None, ...] = sw.request_rates or (None,)
        if sw.service_factors:  # the closed-loop probe the first rates are measured from stays in the plan
            sweep_rates = (None, *sw.request_rates)
        for model_name, fw, task, batch, pc, rate, smp, label, rep, arrivals in itertools.product(
            sw.models,
            sw.frameworks,
            sw.tasks,
            sw.batch_sizes,
            sw.prefix_cache,
            sweep_rates,
            sw.samplings,
            sw.methods,
            range(sw.repeats),
            sw.arrivals,
        ):
            if "trace" in sw.arrivals:  # both arrival kinds at the trace's own mean rate
                key = (task, sw.prompts_per_task)
                rate = rates[key] if key in rates else rates.setdefault(key, replay_rate(cfg.task(task), key[1]))
            if rate is not None and fw not in server_frameworks():
                continue  # request-rate sweeps are for servers; offline engines run batches
            if rate is None and sw.service_factors and rep > 0:
                continue  # one service-rate probe per search sets every repeat's first rates
            pair = cfg.model(model_name)
            m = cfg.method(label)
            if m.frameworks is not None and fw not in m.frameworks:
                continue
            if m.max_batch_size is not None and batch > m.max_batch_size:
                continue
            if m.drafter is not None and m.drafter not in pair.drafters:
                continue
            sampling = dataclasses.replace(smp, seed=smp.seed + rep)
            run_opts = _run_options(smp, pair, pc, rate, sw.prompts_per_task)
            if arrivals != "poisson":  # Poisson cells keep the ids they had before arrivals existed
                run_opts = tuple(sorted({**dict(run_opts), "arrivals": arrivals}.items()))
            base_cell = _with_id(
                Cell(
                    study=cfg.name,
                    hardware=cfg.hardware,
                    framework=fw,
                    method="ar",
                    task=task,
                    model=pair.target,
                    drafter=None,
                    gamma=None,
                    batch_size=batch,
                    repeat=rep,
                    options=run_opts,
                )
            )
            common = dict(
                sampling=sampling,
                prompts=sw.prompts_per_task,
                target=pair.target,
                dtype=pair.dtype,
                tensor_parallel_size=pair.tensor_parallel_size,
                prefix_cache=pc,
                request_rate=rate,
                arrivals=arrivals,
                turns=turns[task],
            )
            add(
                CellPlan(cell=base_cell, label="ar", family="ar", drafter_id=None, baseline_cell_id=None, **common),
                sw.name,
            )
            if m.family == "ar":
                continue
            drafter_id = pair.drafters[m.drafter] if m.drafter else None
            for g in m.gammas or sw.gammas:
                opts = tuple(sorted({**dict(run_opts), **m.options, "label": m.label}.items()))
                cell = _with_id(
                    dataclasses.replace(
                        base_cell, method=m.method or m.family, drafter=drafter_id, gamma=g, options=opts, id=""
                    )
                )
                add(
                    CellPlan(
                        cell=cell,
                        label=m.label,
                        family=m.family,
                        drafter_id=drafter_id,
                        baseline_cell_id=base_cell.cell_id,
                        method_options=tuple(sorted(m.options.items())),
                        **common,
                    ),
                    sw.name,
                )
    out = _paired_only([dataclasses.replace(p, sweeps=tuple(sorted(sweeps_of[cid]))) for cid, p in plans.items()])
    out += controls(out) if cfg.aa_control else []

    # group by engine; inside, by pairing group with the baseline first (in-process engines switch
    # method per cell for free), or by speculative config (a server restarts for each config)
    def order(p: CellPlan) -> tuple[Any, ...]:
        engine = (p.cell.framework, p.target, p.dtype, p.tensor_parallel_size)
        if p.cell.framework in server_frameworks():
            config = (
                p.cell.method != "ar",
                str(p.drafter_id or ""),
                p.cell.method,
                p.cell.gamma or 0,
                "ar" if p.family == CONTROL_FAMILY else p.label,  # an A/A control right after its baseline
                p.prefix_cache,
            )
            # rates ascending within a repeat: a capacity search stops above its first break (run/capacity_search.py)
            rate = -1.0 if p.request_rate is None else p.request_rate
            return (engine, config, p.cell.task, p.cell.batch_size, p.cell.repeat, rate)
        group = p.baseline_cell_id or p.cell_id
        # an engine that loads drafters per cell runs each baseline next to its speculative cells;
        # one that takes its drafter at start groups cells by drafter (one load each)
        drafter = "" if p.cell.framework in drafter_per_cell() else str(p.drafter_id or "")
        return (engine, drafter, group, not p.is_baseline, p.cell.method, p.cell.gamma or 0)

    engine_first = sorted(out, key=order)
    if any(p.cell.framework in server_frameworks() for p in out):
        return engine_first
    return _baselines_first(engine_first)


def controls(plans: Sequence[CellPlan]) -> list[CellPlan]:
    """One A/A control per framework: its first offline AR cell at batch 1 (a headline sweep's first,
    repeat 0, greedy, of the most prompts) measured again as if it were a speculative cell paired with
    itself, through the same pairing, analysis and report path; it reads 1x within its interval when the
    measurement is unbiased.  The most prompts: a support check's 2-prompt AR cell has no interval (in
    make study-engines at 24 tokens the cell-id order chose it for vLLM, and its control read "n too small").
    Greedy: the headline row's own baseline, whose extension chunks the control shares (in make study the
    cell-id order chose llama.cpp's T = 0.7 baseline, whose row then pooled the control's extra prompts:
    AR over 20 prompts beside prompt lookup's 10)."""

    def rank(p: CellPlan) -> tuple[Any, ...]:
        headline = any(s.startswith("hardware") for s in p.sweeps)
        return (not headline, p.sampling.temperature > 0, -p.prompts, p.cell.task, p.cell_id)

    out = []
    for fw in sorted({p.cell.framework for p in plans}):
        bases = [
            p
            for p in plans
            if p.cell.framework == fw and p.is_baseline and p.request_rate is None and p.cell.batch_size == 1
        ]
        bases = [p for p in bases if p.cell.repeat == 0 and p.prompt_offset == 0 and p.turns == 1]
        if not bases:
            continue
        base = min(bases, key=rank)
        opts = tuple(sorted({**dict(base.cell.options), "label": CONTROL_LABEL}.items()))
        cell = _with_id(dataclasses.replace(base.cell, options=opts, id=""))
        out.append(
            dataclasses.replace(
                base,
                cell=cell,
                label=CONTROL_LABEL,
                family=CONTROL_FAMILY,
                baseline_cell_id=base.cell_id,
                sweeps=(CONTROL_FAMILY,),
            )
        )
    return out


def _paired_only(plans: list[CellPlan]) -> list[CellPlan]:
    """Without the AR cells of a (framework, target) that runs no speculative row where the study
    measures speculation: they pair with nothing (on a GPU profile, e.g. a 70B TensorRT engine build
    for a baseline alone).  An AR cell of a sweep without any speculative cell is what that sweep
    asked for (an AR-only capacity search, say): it stays."""
    speculative = {(p.cell.framework, p.target) for p in plans if not p.is_baseline}
    spec_sweeps = {s for p in plans if not p.is_baseline for s in p.sweeps}
    return [
        p
        for p in plans
        if not p.is_baseline or (p.cell.framework, p.target) in speculative or not set(p.sweeps) & spec_sweeps
    ]


def _baselines_first(plans: list[CellPlan]) -> list[CellPlan]:
    """Keep the order but move each baseline just before the first cell that needs it."""
    by_id = {p.cell_id: p for p in plans}
    done: set[str] = set()
    out: list[CellPlan] = []
    for p in plans:
        if p.cell_id in done:
            continue
        if p.baseline_cell_id and p.baseline_cell_id not in done and p.baseline_cell_id in by_id:
            out.append(by_id[p.baseline_cell_id])
            done.add(p.baseline_cell_id)
        out.append(p)
        done.add(p.cell_id)
    return out


def plan_summary(plans: Iterable[CellPlan], warmup_requests: int = 0, warmup_tokens: int = 0) -> dict[str, Any]:
    """Cells, requests and output tokens the plan will decode (for sizing a study before running it)."""
    plans = list(plans)
    requests = sum(p.requests for p in plans)
    tokens = sum(p.requests * p.sampling.max_new_tokens for p in plans)
    return {
        "cells": len(plans),
        "baseline_cells": sum(p.is_baseline for p in plans),
        "requests": requests,
        "output_tokens": tokens,
        # warm-up runs once per engine and configuration (CellPlan.warmup_key; the input-length
        # regime the runner adds can only add more)
        "warmup_tokens": len({(p.backend_key(), p.warmup_key()) for p in plans}) * warmup_requests * warmup_tokens,
        "engines": len({p.backend_key() for p in plans}),
        "by_sweep": {s: sum(s in p.sweeps for p in plans) for s in sorted({s for p in plans for s in p.sweeps})},
    }
