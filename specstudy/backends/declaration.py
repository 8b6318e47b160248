"""One declaration per engine, and the checks every backend shares.

Each engine's package (``backends/<engine>/declaration.py``) declares, once, what the study may
ask of it: the methods it runs, the options each reads, the framework options, which methods
load a drafter, whether speculation is fixed when the engine starts (a server), tensor
parallelism, its environment.  :mod:`specstudy.backends.registry` collects them; config
validation, the plan's checks, the dry run, preflight, the engine pool and the backends
themselves all read that one table (a test keeps it equal to what each backend runs).
Pure data and checks: nothing here imports an engine.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..engine.synthetic import parse_synthetic  # the rule only: torch-free

#: cell options that describe the offered load (serving sweeps), read by the runner, not the engine
LOAD_OPTIONS = frozenset({"rate", "burstiness", "concurrency", "load"})


@dataclass(frozen=True)
class EngineDeclaration:
    """What one framework (a study's ``frameworks:`` name) runs and reads."""

    framework: str
    #: "module:Class" of its backend, under specstudy.backends
    backend: str
    #: kit methods it runs, "ar" first (names as in the study's method rows)
    methods: tuple[str, ...]
    #: the cell (method) options it reads, per method; "*": every speculative method
    method_options: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: the framework options (``framework_options:`` of a study) its constructor reads
    engine_options: tuple[str, ...] = ()
    #: methods that load a drafter checkpoint named in the model pair
    needs_drafter: frozenset[str] = frozenset()
    #: speculation fixed when the engine starts: one engine per method configuration
    server: bool = False
    #: an in-process engine that loads each cell's drafter itself (one engine per target)
    drafter_per_cell: bool = False
    #: hands the prompt loader its tokenizer (a task's input-length policy applies)
    tokenizing: bool = False
    #: splits the model over GPUs (``tensor_parallel_size``)
    tensor_parallel: bool = False
    #: the kit-managed environment it runs in ("vllm", "sglang"); None: the kit's own, or the user's
    environment: str | None = None
    #: (python module that must import, what provides it); None: nothing the kit can check
    requirement: tuple[str, str] | None = None
    #: takes the study's ``device`` (in-process torch engines)
    takes_device: bool = False
    #: takes the model pair's ``dtype`` (llama.cpp runs the GGUF's own precision)
    takes_dtype: bool = True
    #: largest batch it runs (None: any)
    max_batch: int | None = None

    def reads(self, method: str) -> tuple[str, ...]:
        """The cell options ``method`` reads here."""
        star = () if method == "ar" else self.method_options.get("*", ())
        return (*self.method_options.get(method, ()), *star)


#: option names used by no backend that profiles once carried, and what to write instead
RENAMED_OPTIONS = {
    "min_n": "ngram_min",
    "max_n": "ngram_max",
    "prompt_lookup_min": "ngram_min",
    "prompt_lookup_max": "ngram_max",
}


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


def check_engine_options(decl: EngineDeclaration, options: Mapping[str, Any], engine: str | None = None) -> None:
    """Reject framework options no code reads, naming the ones that are read."""
    engine = engine or decl.framework
    bad = sorted(set(options) - set(decl.engine_options))
    if bad:
        raise ValueError(
            f"{engine} option {bad[0]!r} is read by no code; {engine} reads: {sorted(decl.engine_options)}"
        )
