"""What an engine declaration holds, and the checks every backend shares.

Each engine declares once (``specstudy/frameworks/<engine>.py``) what a study may ask of it and
what the kit must know to run it: the methods it runs and the options each reads, its framework
options (kit name -> the engine's own name), which methods load a drafter and in which format,
whether speculation is fixed when the engine starts (a server), tensor parallelism, its pinned
environments, a binary it needs on PATH, the packages provenance records, how long a start takes.
Validation, the plan, the dry run, preflight, installs, provenance, the engine pool and the
backends all read these fields; nothing else holds a per-engine fact.  Pure data and checks:
this package imports nothing above :mod:`specstudy.metrics`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from ..synthetic import parse_synthetic  # torch-free until a rule draws

#: cell options that describe the offered load (serving sweeps), read by the runner, not the engine
LOAD_OPTIONS = frozenset({"rate", "burstiness", "concurrency", "load"})


#: the keyword arguments every server backend takes (``StreamingServerBackend.__init__``): read by
#: the kit's client, not passed to the engine (hence None)
SERVER_OPTIONS: Mapping[str, str | None] = {
    "base_url": None,
    "served_model": None,
    "request_timeout_s": None,
    "idle_timeout_s": None,
    "ready_timeout_s": None,
    "log_dir": None,
    "server_args": None,
    "env": None,
    "extra_body": None,
    "api_key": None,
    "python": None,
}


@dataclass(frozen=True)
class EngineEnv:
    """One pinned environment of an engine: what pip installs into it, nothing else."""

    name: str  # "vllm-cuda", "vllm-cpu", "sglang"
    engine: str  # the engine family and import name: "vllm", "sglang"
    build: str  # "cuda" or "cpu"
    venv: str  # directory name under the root
    packages: tuple[str, ...]  # pip requirement specifiers, installed as given
    requirements_file: str  # the engine's declared Requires-Dist, under environments/requirements/
    remove: tuple[str, ...] = ()  # uninstalled after the install (they break the engine's import)
    #: (requirement, index URL): add the index only when pip cannot resolve the requirement without it
    index_fallbacks: tuple[tuple[str, str], ...] = ()
    notes: str = ""
    #: disk an install writes (GB): vllm-cpu measured here (3.5 GB); the CUDA builds estimated from
    #: their wheels (torch CUDA, flashinfer, the engine), checked before any install starts
    disk_gb: float = 0.0
    #: the CUDA version its pinned wheels are built for ("13.0"): the driver must support it (None: CPU)
    cuda: str | None = None
    #: environment variables its engine needs to start on this build (vLLM's CPU build sizes its KV cache
    #: by one); a study's or the user's own values win
    run_env: Mapping[str, str] = field(default_factory=dict)

    @property
    def engine_requirement(self) -> str:
        """The engine's own pin (the first package), e.g. ``vllm==0.33.0``."""
        return self.packages[0]

    def spec(self) -> dict[str, Any]:
        """What the stamp must match for the environment to be reused."""
        d = asdict(self)
        d.pop("notes")
        d.pop("disk_gb")
        d.pop("cuda")  # a fact about the pins, not part of what is installed
        d.pop("run_env")  # how its engine starts, not what is installed
        spec: dict[str, Any] = json.loads(json.dumps(d))  # lists, as the stamp reads back
        return spec


@dataclass(frozen=True)
class Binary:
    """An executable the user installs (the kit cannot): preflight looks for it on PATH."""

    name: str  # "trtllm-serve", "mlc_llm"
    why: str  # why it is not on PATH here (the kit does not install it, ...)
    hint: str  # how to install it
    cuda_only: bool = False  # runs on NVIDIA GPUs only: refused on a machine without one
    #: the distribution whose version the executable's own interpreter reports (None: not read)
    package: str | None = None


@dataclass(frozen=True, kw_only=True)
class EngineDeclaration:
    """What one framework (a study's ``frameworks:`` name) runs, reads and needs, in five groups."""

    # ---- identity: what a study names and how the kit drives it
    #: the name a study's ``frameworks:`` uses
    framework: str
    #: "module:Class" of its backend, under specstudy.backends
    backend: str
    #: the engine versions its rows are written for, (lowest, first refused) as "major.minor"
    #: (None: no bound); preflight reads the installed version and refuses the rows outside
    versions: tuple[str | None, str | None] | None = None

    # ---- methods and options: what a study may ask of it
    #: kit methods it runs, "ar" first (names as in the study's method rows)
    methods: tuple[str, ...]
    #: the cell (method) options it reads, per method; "*": every speculative method
    method_options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: the framework options (``framework_options:`` of a study): kit name -> the engine's own name
    #: (its flag, argument or field), None where the kit itself reads it; checked at study load
    engine_options: Mapping[str, str | None] = field(default_factory=dict)
    #: engine method names outside the kit's families, and the family each belongs to
    method_families: Mapping[str, str] = field(default_factory=dict)
    #: the seed's hardware-table row of each such method name (the reference methods' say so in their headers)
    method_seed_rows: Mapping[str, str] = field(default_factory=dict)
    #: methods that load a drafter checkpoint named in the model pair
    needs_drafter: frozenset[str] = frozenset()
    #: methods whose drafter drafts all γ tokens in one forward (DFlash, PARD): the cost model counts
    #: their draft cost per block, not per token
    block_drafting: frozenset[str] = frozenset()
    #: the cell options that hand γ to the engine's own schedule, each with the value that keeps γ fixed
    #: (None: any value set is a schedule); the report sets these rows beside the best fixed γ per load
    schedule_options: Mapping[str, Any] = field(default_factory=dict)
    #: whose loader rules a drafter checkpoint must meet ("vllm", "sglang", "trtllm"); None: the
    #: kit's own loaders (or none), checked by the backend itself
    drafter_format: str | None = None
    #: builds an EAGLE/EAGLE-3 draft with the target's context length and refuses a draft whose own
    #: context is shorter (SGLang); False: the draft's context is min(target's, draft's) (vLLM)
    draft_takes_target_context: bool = False
    #: largest batch it runs (None: any)
    max_batch: int | None = None
    #: splits the model over GPUs (``tensor_parallel_size``)
    tensor_parallel: bool = False
    #: takes the study's ``device`` (in-process torch engines)
    takes_device: bool = False
    #: takes the model pair's ``dtype`` (llama.cpp runs the GGUF's own precision)
    takes_dtype: bool = True
    #: loads the model pair's checkpoints (False: weights of its own format, mapped in its options)
    reads_checkpoints: bool = True
    #: hands the prompt loader its tokenizer (a task's input-length policy applies)
    tokenizing: bool = False
    #: an in-process engine that loads each cell's drafter itself (one engine per target)
    drafter_per_cell: bool = False

    # ---- environment: what must be installed, and where
    #: the kit-managed environments it runs in, one per build (none: the kit's own, or the user's)
    environments: tuple[EngineEnv, ...] = ()
    #: an executable the user installs, looked for on PATH by preflight
    binary: Binary | None = None
    #: (python module that must import, what provides it); None: nothing the kit can check
    requirement: tuple[str, str] | None = None
    #: why its own argument parser cannot check a rehearsed row's argv here ("": nothing stops it)
    argv_unchecked_why: str = ""

    # ---- server: how it starts and takes requests
    #: speculation fixed when the engine starts: one engine per method configuration
    server: bool = False
    #: an HTTP server the kit's streaming client drives (it takes :data:`SERVER_OPTIONS` too)
    http: bool = False
    #: ``specstudy serve-bench`` may start it (or attach to it)
    serve_bench: bool = False
    #: seconds a start takes (the dry run's estimate; 0: nothing to start)
    start_s: float = 0.0
    #: where a task's output constraint goes in a request body: kind ("json_schema", "grammar") ->
    #: dotted field path; empty: the kit sends no constraint to this engine (a task with one is refused)
    structured_output_fields: Mapping[str, str] = field(default_factory=dict)
    #: the kinds whose value the engine takes as JSON text, not an object (SGLang's json_schema)
    structured_output_as_text: frozenset[str] = frozenset()
    #: fixed fields sent with a kind, dotted path -> value (TensorRT-LLM's response_format.type)
    structured_output_tags: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: the framework option a server needs set to take constraints at all (None: none needed);
    #: a constrained task on this framework without it is refused at load
    structured_needs_option: str | None = None
    #: the values that option takes (checked at load by the backend)
    structured_option_values: tuple[str, ...] = ()
    #: whether the engine combines constrained decoding with speculation, as ``structured_source``
    #: says: True, False (the framework table says "no"), None (nothing says; the study measures it)
    structured_with_speculation: bool | None = None
    #: where ``structured_with_speculation`` was read (a release note, an issue, a source file)
    structured_source: str = ""

    # ---- provenance: what every study records of it
    #: distributions whose versions every study's provenance records
    provenance_packages: tuple[str, ...] = ()

    @property
    def environment(self) -> str | None:
        """The engine family of its kit-managed environments ("vllm", "sglang"), None without one."""
        return self.environments[0].engine if self.environments else None

    def reads(self, method: str) -> tuple[str, ...]:
        """The cell options ``method`` reads here."""
        star = () if method == "ar" else self.method_options.get("*", ())
        return (*self.method_options.get(method, ()), *star)

    def options_read(self) -> Mapping[str, str | None]:
        """Every framework option it takes: its own, plus the server client's for a server."""
        return {**(SERVER_OPTIONS if self.http else {}), **self.engine_options}


def constraint_body(decl: EngineDeclaration, json_schema: str | None, grammar: str | None) -> dict[str, Any]:
    """The request-body fields that constrain one request's output on ``decl``'s engine ({} without a
    constraint); a constraint the engine cannot take raises, naming what it takes."""
    kind, text = ("json_schema", json_schema) if json_schema else ("grammar", grammar)
    if text is None:
        return {}
    path = decl.structured_output_fields.get(kind)
    if path is None:
        raise ValueError(
            f"framework {decl.framework!r} takes no {kind} constraint; allowed: "
            f"{sorted(decl.structured_output_fields) or 'none (no structured outputs through the kit)'}"
        )
    as_object = kind == "json_schema" and kind not in decl.structured_output_as_text
    fields = {**decl.structured_output_tags.get(kind, {}), path: json.loads(text) if as_object else text}
    body: dict[str, Any] = {}
    for where, value in fields.items():
        _put(body, where, value)
    return body


def _put(body: dict[str, Any], path: str, value: Any) -> None:
    """Set ``body``'s field at the dotted ``path``, its parents created."""
    *parents, leaf = path.split(".")
    for p in parents:
        body = body.setdefault(p, {})
    body[leaf] = value


#: option names used by no backend that profiles once carried, and what to write instead
RENAMED_OPTIONS = {
    "min_n": "ngram_min",
    "max_n": "ngram_max",
    "prompt_lookup_min": "ngram_min",
    "prompt_lookup_max": "ngram_max",
}


@dataclass(frozen=True)
class CellCheck:
    """One cell as a backend checks it before any model loads (``Backend.check_cell``): the method,
    γ and method options, the target and drafter, which build the study uses, the batch size."""

    method: str
    gamma: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    model: str = ""
    drafter: str | None = None
    cuda: bool | None = None  # the CUDA build (True) or the CPU one; None: this machine's
    batch_size: int = 1

    def against(self, decl: EngineDeclaration, engine: str | None = None, methods: Iterable[str] | None = None) -> None:
        """:func:`check_method` of this cell against ``decl`` (named ``engine``, narrowed to ``methods``)."""
        check_method(
            decl,
            self.method,
            self.gamma,
            self.options,
            self.drafter,
            batch_size=self.batch_size,
            engine=engine,
            methods=methods,
        )


def _unconditional_rates(alpha: float, gamma: int) -> tuple[float, ...]:
    """i.i.d. acceptance as per-position unconditional rates: P(first i+1 drafts all accepted) = α^(i+1)."""
    return tuple(alpha ** (i + 1) for i in range(gamma))


def synthetic_rule(options: Mapping[str, Any], gamma: int | None) -> Any:
    """The cell's synthetic-acceptance rule (None without one), checked against γ."""
    if options.get("synthetic_acceptance") is None:
        return None
    rule = parse_synthetic(options["synthetic_acceptance"])
    rule.check_gamma(int(gamma or 0))
    return rule


def engine_schedule(decl: EngineDeclaration, options: Mapping[str, Any]) -> str | None:
    """The engine's own γ schedule a cell runs, as ``option=value`` (None: the cell's γ is fixed)."""
    for key, fixed in decl.schedule_options.items():
        value = options.get(key)
        if value not in (None, False, "", fixed):
            return f"{key}={value}"
    return None


def gamma_per_batch(text: str, gamma: int) -> list[tuple[int, int, int]]:
    """The kit's ``gamma_per_batch`` text, ``"1-4:4,5-16:3"`` (batch range: γ), as [(1, 4, 4), (5, 16, 3)]:
    one schedule of γ by batch size that each engine writes in its own form (vLLM's ranges, TensorRT-LLM's
    thresholds).  Each γ at most the cell's ``gamma`` (the most the engine drafts)."""
    out = []
    for part in str(text).split(","):
        try:
            span, k = part.split(":")
            lo, hi = span.split("-")
            entry = (int(lo), int(hi), int(k))
        except ValueError:
            raise ValueError(f"gamma_per_batch={text!r}: allowed 'start-end:gamma,...' (e.g. '1-4:4,5-64:2')") from None
        if not 1 <= entry[0] <= entry[1] or not 0 <= entry[2] <= gamma:
            raise ValueError(f"gamma_per_batch entry {part!r}: allowed 1 <= start <= end and 0 <= gamma <= {gamma}")
        out.append(entry)
    return out


def pinned_version(requirement: str) -> str:
    """``vllm==0.33.0`` → ``0.33.0``."""
    return requirement.split("==", 1)[1].split("+", 1)[0]


def check_method(
    decl: EngineDeclaration,
    method: str,
    gamma: int | None,
    options: Mapping[str, Any] | Iterable[tuple[str, Any]],
    drafter: str | None,
    *,
    batch_size: int = 1,
    engine: str | None = None,
    methods: Iterable[str] | None = None,
) -> None:
    """The shared part of every backend's cell check: method, γ, drafter, option keys, batch size.

    ``engine`` names it in messages (e.g. with its pinned version), ``methods`` narrows the
    declared ones to what that version runs.  Raises ValueError naming the bad value and what is
    allowed, before any model loads.
    """
    engine = engine or decl.framework
    allowed = list(dict.fromkeys(["ar", *(decl.methods if methods is None else methods)]))
    if method not in allowed:
        raise ValueError(f"method={method!r} is not available in {engine}; allowed: {allowed}")
    if decl.max_batch is not None and batch_size > decl.max_batch:
        raise ValueError(f"{engine}: batch_size={batch_size} is not allowed; at most {decl.max_batch}")
    opts = dict(options or {})
    if method != "ar":
        if isinstance(gamma, bool) or not isinstance(gamma, int) or gamma < 1:
            raise ValueError(f"{engine} method={method!r} needs gamma >= 1 (draft tokens per step), got {gamma!r}")
        if method in decl.needs_drafter and not drafter:
            raise ValueError(f"{engine} method={method!r} needs a drafter (a model id or path)")
        if "synthetic_acceptance" in opts:
            synthetic_rule(opts, gamma)  # a bad rule names itself here, before any engine starts
    readable = set(decl.reads(method)) | LOAD_OPTIONS
    for key in opts:
        if key in readable:
            continue
        hint = f" (did you mean {RENAMED_OPTIONS[key]!r}?)" if key in RENAMED_OPTIONS else ""
        raise ValueError(
            f"{engine} method={method!r} option {key!r} is read by no code{hint}; "
            f"{engine} reads: {sorted(readable - LOAD_OPTIONS) or 'none'} (plus load options "
            f"{sorted(LOAD_OPTIONS)})"
        )


def check_choice(engine: str, key: str, value: Any, allowed: Iterable[str]) -> None:
    """Refuse a framework option's value outside ``allowed``, naming both (before any engine starts)."""
    names = sorted(allowed)
    if value not in names:
        raise ValueError(f"{engine} {key}={value!r}: allowed {names}")


def version_allowed(version: str, bounds: tuple[str | None, str | None] | None) -> bool:
    """Whether ``version`` ("1.2.0rc3") lies in [lowest, first refused) by its major.minor."""
    if bounds is None:
        return True

    def key(v: str) -> tuple[int, ...]:
        parts = [p for p in v.split(".")[:2]]
        return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)

    low, high = bounds
    return (low is None or key(version) >= key(low)) and (high is None or key(version) < key(high))


def check_engine_options(decl: EngineDeclaration, options: Mapping[str, Any], engine: str | None = None) -> None:
    """Reject framework options no code reads, naming every bad key and the ones that are read."""
    engine = engine or decl.framework
    allowed = decl.options_read()
    bad = sorted(set(options) - set(allowed))
    if bad:
        names, verb = ", ".join(repr(b) for b in bad), "is" if len(bad) == 1 else "are"
        raise ValueError(f"{engine} option {names} {verb} read by no code; {engine} reads: {sorted(allowed)}")
