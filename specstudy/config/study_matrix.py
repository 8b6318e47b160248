"""The study matrix of one machine: the ``study:`` section of ``params/hardware/<gpu>.yaml``.

Loading validates everything that can be checked without loading a model: the file's shape,
types and ranges (pydantic schemas below), then the relations between its parts (labels,
drafters, frameworks that run each method, model names, draft-vs-target tokenizers from metadata;
:mod:`specstudy.config.checks`).  Expanding the sweeps into cells is :mod:`specstudy.run.plan`.

Schema (every key optional except ``models``; sweeps inherit the top-level axes)::

    study:
      name: cpu-default
      device: cpu                 # torch device for in-process backends
      models:                     # targets, each with the drafters it can use
        - name: smollm2           # short name used in sweeps
          target: smollm2-135m    # registry name, local dir or hub id
          dtype: float32          # float32, bfloat16, float16, float64, auto
          quantization: none      # none, awq, gptq, fp8, int8 (the cost model's weight bytes)
          tensor_parallel_size: 1 # >1: handed to vLLM / SGLang tensor parallelism
          drafters: {heads: params/drafters/x.safetensors, self15: "self:15", d: org/draft-model}
          params: {target: 1.35e+8}   # parameter counts for the cost model's predictions
          vocab_size: {target: 49152} # only used when no registry entry or config is reachable
      methods:                    # the table rows: engine method name, family, label, drafter, options
        - {method: ngram, label: Prompt lookup, options: {ngram_min: 1, ngram_max: 3}}
        - {method: heads, label: Heads, drafter: heads, gammas: [3], max_batch_size: 1, optional: true}
        - {method: eagle, family: heads, label: EAGLE-2, drafter: eagle, frameworks: [vllm, sglang]}
      frameworks: [reference]     # reference, hf, vllm, vllm-server, sglang, openai
      framework_options: {vllm: {max_model_len: 4096}}   # passed to the backend's constructor
      tasks: [code, translation, ../my/heldout.yaml]   # names in params/tasks/, or task file paths
      gammas: [2, 4]
      batch_sizes: [1, 2, 4]
      request_rates: []           # serving sweeps (server frameworks only; inf = all at once)
      repeats: 1
      warmup: {requests: 1, max_new_tokens: 8}
      sampling:                   # one setting, or a list: an axis (each method and its baseline share it)
        - {temperature: 0.0, top_p: 1.0, top_k: 0, seed: 0, ignore_eos: true}
        - {temperature: 0.7, top_p: 0.9}
      max_new_tokens: 48
      prompts_per_task: 4
      prefix_cache: [false]
      telemetry_period_s: 0.5
      aa_control: false           # true: per framework, an A/A control (AR paired with AR) opens Validity
      aa_precision: null          # {rel_half_width: 0.03, ...}: the controls grow like a headline row (aa_control: true)
      busy_rerun_budget_s: 0      # an in-time group measured on a busy machine runs again if it took <= this
      cells_budget_s: null        # 570: extensions and busy reruns start only while the cells fit 570 s
      servers_in_time: {}         # {llamacpp: 5}: up to 5 of its servers at once, AR and speculative arms alternated
      sweeps:                     # named sub-matrices; a cell shared by sweeps runs once
        hardware: {tasks: [code, qa], gammas: [4], batch_sizes: [1]}
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..records import Sampling
from . import checks
from .errors import ParamsError, ParamsProblems, validate
from .files import hardware_file, load_yaml
from .schema import NOTEBOOKS, MethodSpec, ModelPair, SamplingSpec, Slo, StudySpec, SweepSpec
from .task import ParsedTask, TaskConfig, is_task_path, load_task_config, parse_task, task_candidates

# --------------------------------------------------------------------------------------------
# the resolved matrix


@dataclass(frozen=True)
class Sweep:
    """A named sub-matrix: the cross product of its axes (top-level values filled in)."""

    name: str
    models: tuple[str, ...]
    methods: tuple[str, ...]  # method labels
    frameworks: tuple[str, ...]
    tasks: tuple[str, ...]
    gammas: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    request_rates: tuple[float, ...]
    repeats: int
    samplings: tuple[Sampling, ...]
    prompts_per_task: int
    prefix_cache: tuple[bool, ...]
    description: str = ""
    #: poisson and/or trace (a trace task's recorded arrivals, and Poisson at the trace's mean rate)
    arrivals: tuple[str, ...] = ("poisson",)
    #: the stopping rule (PrecisionSpec's fields), None: a fixed prompts_per_task
    precision: Mapping[str, Any] | None = None
    #: rates_from_service: the first rates as factors of the sweep's closed-loop probe's served rate
    #: (specstudy.run.service_grid); () : the rates are request_rates alone
    service_factors: tuple[float, ...] = ()
    #: the key the sweep's most prompts per task come from (prompts_per_task or precision.max_prompts,
    #: the sweep's own or the top level's): what a task with too few prompts names
    prompts_key: str = "study.prompts_per_task"

    @property
    def max_prompts(self) -> int:
        """The most prompts a cell of this sweep measures per task (its precision cap, else prompts_per_task)."""
        return max(self.prompts_per_task, int((self.precision or {}).get("max_prompts", 0)))


@dataclass(frozen=True)
class StudyConfig:
    name: str
    hardware: str
    file: str
    device: str
    models: tuple[ModelPair, ...]
    methods: tuple[MethodSpec, ...]
    sweeps: tuple[Sweep, ...]
    warmup_requests: int
    warmup_max_new_tokens: int
    telemetry_period_s: float
    warm_engine_warmup_tokens: int | None = None
    aa_control: bool = False  # an A/A control cell per framework (:func:`specstudy.run.plan.controls`)
    #: the A/A controls' precision target (a sweep's ``precision`` keys; None: their first prompts only)
    aa_precision: Mapping[str, Any] | None = None
    busy_rerun_budget_s: float = 0.0  # an in-time group measured on a busy machine is rerun when it took at most this
    #: seconds a run's cells may take: extensions and busy reruns start only within it (None: no limit)
    cells_budget_s: float | None = None
    #: server framework -> servers it may hold at once to time arms side by side (absent or 1: cell after cell)
    servers_in_time: Mapping[str, int] = field(default_factory=dict)
    framework_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    notebooks: tuple[str, ...] = NOTEBOOKS
    engine_costs: tuple[str, ...] = ()
    #: goodput's SLOs, ms: {"ttft_ms", "tpot_ms", "e2e_ms"} (None: not part of the SLO)
    slo: Mapping[str, Any] = field(default_factory=lambda: Slo().model_dump())
    #: task name (its file's stem) -> its task file: the sweeps name tasks, the runner reads these files
    task_files: Mapping[str, str] = field(default_factory=dict)
    #: task name -> its file parsed and validated once at load; every later step reads these
    tasks: Mapping[str, ParsedTask] = field(default_factory=dict, compare=False, repr=False)

    def task_file(self, name: str) -> str:
        """The file of one of the study's tasks (a name outside the study: itself, looked up in params/tasks/)."""
        return self.task_files.get(name, name)

    def task(self, name: str) -> TaskConfig:
        """The validated config of one of the study's tasks (parsed at load); a name outside the study
        (a test's, a custom loader's) is read from params/tasks/.  Raises the file's first problem."""
        if name in self.tasks:
            return self.tasks[name].require()
        return load_task_config(self.task_file(name))

    def model(self, name: str) -> ModelPair:
        return next(m for m in self.models if m.name == name)

    def method(self, label: str) -> MethodSpec:
        return next(m for m in self.methods if m.label == label)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for the plan snapshot (``study.json``)."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        d["models"] = [m.model_dump() for m in self.models]
        d["methods"] = [m.model_dump() for m in self.methods]
        d["sweeps"] = [dataclasses.asdict(s) for s in self.sweeps]
        d["framework_options"] = {k: dict(v) for k, v in self.framework_options.items()}
        d["slo"] = dict(self.slo)
        d["task_files"] = dict(self.task_files)
        d.pop("tasks")  # the files themselves stand in the snapshot (the report reads its tasks section)
        return d


_DEFAULTS: dict[str, Any] = {
    "frameworks": ["reference"],
    "gammas": [4],
    "batch_sizes": [1],
    "request_rates": [],
    "repeats": 1,
    "sampling": [SamplingSpec()],
    "max_new_tokens": 64,
    "prompts_per_task": 4,
    "prefix_cache": [False],
    "arrivals": ["poisson"],
}


def _resolve_sweep(
    name: str,
    spec: SweepSpec,
    top: StudySpec,
    file: Any,
    models: tuple[ModelPair, ...],
    methods: tuple[MethodSpec, ...],
    frameworks: list[str],
    tasks: list[str],
    task_files: dict[str, str],
) -> Sweep:
    """One sweep with the top level's axes filled in; names checked against what exists.

    Task entries become task names (their files' stems), their files gathered in ``task_files``.
    """
    prefix = f"study.sweeps.{name}." if name != "default" else "study."

    def axis(key: str) -> tuple[Any, str]:
        own = getattr(spec, key)
        if own is not None:
            return own, prefix
        top_v = getattr(top, key)
        return (top_v if top_v is not None else _DEFAULTS.get(key, list(tasks) if key == "tasks" else None)), "study."

    def names(key: str, values: list[Any], where: str, allowed: list[str]) -> tuple[Any, ...]:
        if not values and key != "request_rates":
            raise ParamsError(file, f"{where}{key}", values, "a non-empty list")
        for v in values:
            if v not in allowed:
                raise ParamsError(file, f"{where}{key}", v, allowed)
        return tuple(values)

    labels = [m.label for m in methods]
    sweep_methods = spec.methods if isinstance(spec.methods, list) else labels  # None or "all": every method
    sweep_models = spec.models if spec.models is not None else [m.name for m in models]
    (fws, fw_at), (ts, ts_at) = axis("frameworks"), axis("tasks")
    resolved: dict[str, Any] = {}
    for key in ("gammas", "batch_sizes", "request_rates", "prefix_cache", "arrivals"):
        value, where = axis(key)
        resolved[key] = names(key, value, where, value) if key != "request_rates" else tuple(value)
    if "trace" in resolved["arrivals"] and resolved["request_rates"]:
        raise ParamsError(
            file,
            f"{axis('request_rates')[1]}request_rates",
            list(resolved["request_rates"]),
            "[] with arrivals: trace (a trace sets its own rate; Poisson runs beside it at the same mean rate)",
        )
    max_new = axis("max_new_tokens")[0]
    precision, prec_at = axis("precision")
    (ppt, ppt_at) = axis("prompts_per_task")
    if precision is not None and precision.max_prompts < ppt:
        raise ParamsError(
            file,
            f"{prec_at}precision.max_prompts",
            precision.max_prompts,
            f">= prompts_per_task ({ppt}), the minimum n",
        )
    if not ts:
        raise ParamsError(file, f"{ts_at}tasks", ts, "a non-empty list")
    task_names_ = tuple(_task_name(t, file, f"{ts_at}tasks", tasks, task_files) for t in ts)
    return Sweep(
        name=name,
        models=names("models", sweep_models, prefix, [m.name for m in models]),
        methods=names("methods", sweep_methods, prefix, labels),
        frameworks=names("frameworks", fws, fw_at, frameworks),
        tasks=task_names_,
        repeats=axis("repeats")[0],
        samplings=tuple(s.sampling(max_new) for s in axis("sampling")[0]),
        prompts_per_task=ppt,
        description=spec.description,
        precision=precision.model_dump() if precision is not None else None,
        service_factors=tuple(spec.rates_from_service or ()),
        prompts_key=f"{prec_at}precision.max_prompts"
        if precision is not None and precision.max_prompts > ppt
        else f"{ppt_at}prompts_per_task",
        **resolved,
    )


def _task_name(entry: str, file: Any, key: str, known: list[str], task_files: dict[str, str]) -> str:
    """A ``tasks:`` entry (a name in params/tasks/, or a task file's path, relative to the study file's
    folder or the repository) as its task name, its file recorded; two files of one name are refused."""
    cands = task_candidates(entry, Path(file).parent)
    found = next((c for c in cands if c.is_file()), None)
    if found is None:
        if is_task_path(entry):
            raise ParamsError(
                file,
                key,
                entry,
                f"a name in params/tasks/ ({', '.join(known)}) or an existing task file",
                "looked at " + ", ".join(str(c) for c in cands),
            )
        raise ParamsError(file, key, entry, known, "or a path to a task file (.yaml)")
    path, name = str(found.absolute()), found.stem
    if task_files.setdefault(name, path) != path:
        raise ParamsError(
            file,
            key,
            entry,
            f"a task file whose name (its file's stem) no other task of the study has; {name!r} is {task_files[name]}",
            "rename one of the two files",
        )
    return name


def unused_entries(
    spec: StudySpec, sweeps: tuple[Sweep, ...], methods: tuple[MethodSpec, ...], file: Any, tasks: list[str]
) -> list[ParamsError]:
    """Top-level ``tasks``, ``methods``, ``frameworks`` and ``gammas`` entries that no sweep uses
    (every sweep named its own): one problem each, so a user's task listed there is not silently
    never run.  ``methods`` are those left after optional ones were dropped; AR runs as every
    sweep's baseline, so it is always used."""
    used: dict[str, set[Any]] = {
        "tasks": {t for sw in sweeps for t in sw.tasks},
        "methods": {m for sw in sweeps for m in sw.methods},
        "frameworks": {f for sw in sweeps for f in sw.frameworks},
        "gammas": {g for sw in sweeps for g in sw.gammas},
    }
    out = []
    for key in used:
        entries = [m for m in methods if m.method != "ar"] if key == "methods" else getattr(spec, key)
        if not entries or not spec.sweeps:
            continue
        for entry in entries:
            name: Any = entry.label if key == "methods" else entry
            if key == "tasks":
                try:
                    name = _task_name(str(entry), file, "study.tasks", tasks, {})
                except ParamsError:
                    continue  # a bad entry no sweep reads: unused, and named below by its own text
            if name not in used[key]:
                out.append(
                    ParamsError(
                        file,
                        f"study.{key}",
                        entry if key != "methods" else name,
                        f"an entry some sweep uses ({', '.join(map(str, sorted(used[key], key=str)))})",
                        "every sweep names its own, so this one never runs: remove it, or add it to a sweep "
                        "(--allow-unused: warn instead)",
                    )
                )
    return out


def load_study(
    hardware: str,
    path: str | os.PathLike[str] | None = None,
    check_tokenizers: bool = True,
    allow_unused: bool = False,
) -> StudyConfig:
    """Read and validate the ``study:`` section of ``params/hardware/<hardware>.yaml`` (or ``path``).

    Raises :class:`ParamsError` naming file, key, value and allowed values; loads no model.  Task
    entries are resolved to their files, and each file is parsed once here (``StudyConfig.tasks``:
    every later step reads these); what they say and the prompts they hold are checked, every
    problem at once, by :func:`specstudy.run.task_checks.check_tasks` (it reads the data).
    """
    file = Path(path) if path else hardware_file(hardware)
    data = load_yaml(file)
    if not isinstance(data.get("study"), dict):
        raise ParamsError(
            file, "study", data.get("study"), "a mapping with " + ", ".join(sorted(StudySpec.model_fields))
        )
    spec: StudySpec = validate(StudySpec, data["study"], file, "study.")
    frameworks, tasks = checks.known_frameworks(), checks.known_tasks()
    models, methods = checks.unique_models_and_methods(spec, file, frameworks)
    methods, dropped = checks.drop_missing_optional(methods, models, file)
    models = tuple(
        p.model_copy(
            update={
                "drafters": {
                    k: v for k, v in p.drafters.items() if k in {m.drafter for m in methods} or checks.known_model(v)
                }
            }
        )
        for p in models
    )
    checks.framework_options(spec.framework_options, file, frameworks)
    if spec.aa_precision is not None and not spec.aa_control:
        raise ParamsError(
            file,
            "study.aa_precision",
            spec.aa_precision.model_dump(),
            "aa_control: true",
            "it targets the A/A controls",
        )
    checks.servers_in_time(spec.servers_in_time, spec.framework_options, file)
    raw_sweeps = spec.sweeps or {"default": None}
    sweeps = []
    task_files: dict[str, str] = {}
    for name, sw in raw_sweeps.items():
        sw = sw or SweepSpec()
        if isinstance(sw.methods, list):
            kept = [label for label in sw.methods if label not in dropped]
            if sw.methods and not kept:
                continue  # a sweep of skipped optional methods only
            sw = sw.model_copy(update={"methods": kept})
        sweeps.append(_resolve_sweep(str(name), sw, spec, file, models, methods, frameworks, tasks, task_files))
    cfg = StudyConfig(
        name=spec.name or f"{hardware}-study",
        hardware=hardware,
        file=str(file),
        device=spec.device,
        models=models,
        methods=methods,
        sweeps=tuple(sweeps),
        warmup_requests=spec.warmup.requests,
        warmup_max_new_tokens=spec.warmup.max_new_tokens,
        warm_engine_warmup_tokens=spec.warmup.warm_engine_max_new_tokens,
        telemetry_period_s=float(spec.telemetry_period_s),
        aa_control=spec.aa_control,
        aa_precision=spec.aa_precision.model_dump() if spec.aa_precision is not None else None,
        busy_rerun_budget_s=float(spec.busy_rerun_budget_s),
        cells_budget_s=None if spec.cells_budget_s is None else float(spec.cells_budget_s),
        servers_in_time=dict(spec.servers_in_time),
        engine_costs=tuple(spec.engine_costs),
        framework_options={k: dict(v) for k, v in spec.framework_options.items()},
        notebooks=tuple(spec.notebooks),
        slo=spec.slo.model_dump(),
        task_files=task_files,
        tasks={name: parse_task(path) for name, path in task_files.items()},
    )
    unused = unused_entries(spec, cfg.sweeps, methods, file, tasks)
    if unused and not allow_unused:
        raise ParamsProblems(unused, "study entries")
    for problem in unused:
        warnings.warn(f"unused: {problem}", stacklevel=2)
    used = {fw for sw in cfg.sweeps for fw in sw.frameworks}
    for fw in cfg.engine_costs:
        if fw not in used:
            raise ParamsError(
                file,
                "study.engine_costs",
                fw,
                sorted(used & {"llamacpp"}),
                "costs are measured for an engine the study's sweeps run",
            )
    checks.check_model_names(cfg)
    if check_tokenizers:
        checks.draft_tokenizers(cfg)
    return cfg
