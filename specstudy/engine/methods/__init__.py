"""Method registry of the reference engine: every method file's ``SPEC`` (an EngineMethod), by name.

A method is one file, ``specstudy/engine/methods/<name>.py`` (or one in a folder named in
``SPECSTUDY_METHOD_DIRS``): a literal ``HEADER = {...}`` first (name, family, report order,
drafter, γ, largest batch, option names), then ``SPEC = EngineMethod.from_header(HEADER,
decode=..., options={name: validator})``.  The registry is the headers
(:func:`specstudy.frameworks.reference.method_headers`, read without importing anything), so the
study's checks, the plan and the engine see the same methods; :func:`get_method` refuses a SPEC
that differs from its file's header.  ``decode(job) -> list[RowTrace]`` decodes a batch of prompts
(one :class:`~specstudy.engine.trace.RowTrace` per prompt, in order).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from ...frameworks.reference import BUILTIN_METHODS, MethodHeader, method_headers
from ...records import Sampling
from ...synthetic import SyntheticAcceptance, parse_synthetic
from ..sampling import make_generator
from ..speculate import StaticGamma, speculative_decode


@dataclass
class DecodeJob:
    """Everything a method needs to decode one batch."""

    target: Any  # a transformers causal LM (eval mode, on ``device``)
    prompts: Sequence[Sequence[int]]
    sampling: Sampling
    gamma: int | None = None
    drafter: Any = None  # a causal LM sharing the target's tokenizer (draft_target)
    options: Mapping[str, Any] = field(default_factory=dict)
    eos_token_ids: Sequence[int] = ()
    device: str | torch.device = "cpu"

    def generator(self) -> torch.Generator:
        return make_generator(self.sampling.seed, self.device)

    def option(self, name: str, default: Any = None) -> Any:
        return self.options.get(name, default)

    @property
    def draft_length(self) -> int:
        """γ of a method that drafts (its :meth:`EngineMethod.check` required an int >= 1)."""
        if self.gamma is None:
            raise ValueError("this method drafts gamma tokens per step: DecodeJob.gamma is None")
        return self.gamma


_M = TypeVar("_M", bound="EngineMethod")


@dataclass(frozen=True)
class EngineMethod:
    """What a method is and needs, checked before any model is loaded."""

    name: str
    decode: Callable[[DecodeJob], list[Any]]  # one RowTrace per prompt
    description: str = ""
    needs_drafter: bool = False
    uses_gamma: bool = True
    max_batch: int | None = None  # None: any batch size
    options: Mapping[str, Callable[[Any], Any]] = field(default_factory=dict)  # name -> validator/converter
    cross_check: Callable[[dict[str, Any]], None] | None = None  # checks between options (raises ValueError)
    #: how the backend turns cell.drafter (a name) into DecodeJob.drafter; None: a causal LM from
    #: specstudy.data.model_files.  Called as load_drafter(name, target, device, dtype).
    load_drafter: Callable[[str, Any, str, str], Any] | None = None
    family: str = ""  # the report section (from the header)

    @classmethod
    def from_header(cls: type[_M], header: Mapping[str, Any], **spec: Any) -> _M:
        """The method its file's ``HEADER`` describes, with the code only the engine holds (``decode``,
        option validators, loaders): one source for what the catalogue and the engine say of it."""
        h = MethodHeader.of(dict(header))
        options = spec.pop("options", {})
        if set(options) != set(h.options):
            raise TypeError(
                f"method {h.name!r}: option validators {sorted(options)} != HEADER options {sorted(h.options)}"
            )
        return cls(
            name=h.name,
            family=h.family,
            options=options,
            needs_drafter=h.needs_drafter,
            uses_gamma=h.uses_gamma,
            max_batch=h.max_batch,
            **spec,
        )

    def agrees_with(self, h: MethodHeader) -> bool:
        """Whether this SPEC says what its file's header says (a hand-built SPEC may not)."""
        mine = (self.name, self.family, self.needs_drafter, self.uses_gamma, self.max_batch, set(self.options))
        return mine == (h.name, h.family, h.needs_drafter, h.uses_gamma, h.max_batch, set(h.options))

    def check(self, gamma: int | None, batch_size: int, drafter: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        """Validate a cell's settings for this method; returns the converted options."""
        if self.uses_gamma and (gamma is None or not isinstance(gamma, int) or gamma < 1):
            raise ValueError(f"method {self.name!r}: gamma={gamma!r}, need an int >= 1")
        if self.needs_drafter and not drafter:
            raise ValueError(f"method {self.name!r} needs a drafter model (--drafter / cell.drafter)")
        if not self.needs_drafter and drafter:
            raise ValueError(f"method {self.name!r} takes no drafter model; got drafter={drafter!r}")
        if self.max_batch is not None and batch_size > self.max_batch:
            raise ValueError(f"method {self.name!r}: batch_size={batch_size} > {self.max_batch} (not supported)")
        out: dict[str, Any] = {}
        for k, v in options.items():
            if k == SYNTHETIC and k not in self.options:
                raise ValueError(
                    f"method {self.name!r} verifies no drafts: option {SYNTHETIC}={v!r} applies to "
                    f"{synthetic_methods()}"
                )
            if k not in self.options:
                raise ValueError(f"method {self.name!r}: option {k!r} is not known; allowed: {sorted(self.options)}")
            try:
                out[k] = self.options[k](v)
            except (TypeError, ValueError) as e:
                raise ValueError(f"method {self.name!r}: option {k}={v!r}: {e}") from None
        if SYNTHETIC in out:
            assert gamma is not None  # every method with the option drafts: uses_gamma checked it above
            try:
                out[SYNTHETIC].check_gamma(max(gamma, out.get("gamma_max", gamma)))
            except ValueError as e:
                raise ValueError(f"method {self.name!r}: option {SYNTHETIC}={options[SYNTHETIC]!r}: {e}") from None
        if self.cross_check is not None:
            self.cross_check(out)
        return out


def method_names() -> list[str]:
    """Every method the reference engine runs (its method files' headers), sorted."""
    return sorted(method_headers())


def get_method(name: str) -> EngineMethod:
    """The ``SPEC`` of method ``name``, its module imported (torch and all) on first use."""
    headers = method_headers()
    if name not in headers:
        raise ValueError(f"method={name!r} is not known to the reference engine; allowed: {method_names()}")
    header = headers[name]
    spec: EngineMethod = _module(Path(header.file)).SPEC
    if not spec.agrees_with(header):
        raise TypeError(f"{header.file}: SPEC differs from HEADER; build it with EngineMethod.from_header(HEADER, ...)")
    return spec


def _module(path: Path) -> Any:
    """A method file's module: a submodule of this package, or one loaded from its own folder."""
    if path.parent == BUILTIN_METHODS:
        return importlib.import_module(f"{__name__}.{path.stem}")
    name = f"specstudy_methods.{path.stem}"
    if name not in sys.modules or getattr(sys.modules[name], "__file__", None) != str(path):
        loader = importlib.util.spec_from_file_location(name, path)
        assert loader is not None and loader.loader is not None
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        loader.loader.exec_module(module)
    return sys.modules[name]


# ---- option validators shared by the method modules


def _as_int(v: Any) -> int:
    """An int from an int, an integral float or a decimal string (CLI options arrive as text)."""
    if isinstance(v, bool):
        raise ValueError("need an int, not a bool")
    if isinstance(v, str):
        v = v.strip()
        if not v.lstrip("-").isdigit():
            raise ValueError("need an int")
        return int(v)
    if int(v) != v:
        raise ValueError("need an int")
    return int(v)


def positive_int(v: Any) -> int:
    n = _as_int(v)
    if n < 1:
        raise ValueError("need an int >= 1")
    return n


def non_negative_int(v: Any) -> int:
    n = _as_int(v)
    if n < 0:
        raise ValueError("need an int >= 0")
    return n


def non_negative_float(v: Any) -> float:
    f = float(v)
    if f < 0:
        raise ValueError("need a number >= 0")
    return f


def probability(v: Any) -> float:
    f = float(v)
    if not 0.0 <= f <= 1.0:
        raise ValueError("need a number in [0, 1]")
    return f


def one_of(*allowed: Any) -> Callable[[Any], Any]:
    def check(v: Any) -> Any:
        if v not in allowed:
            raise ValueError(f"allowed: {list(allowed)}")
        return v

    return check


#: the chain methods' ``draft_in_prefill`` option: the prompt pass also verifies drafts proposed
#: from the prompt (see :func:`specstudy.engine.speculate.speculative_decode`)
DRAFT_IN_PREFILL = one_of("off", "on")


_D = TypeVar("_D", bound=torch.nn.Module)


def job_drafter(job: DecodeJob, kind: type[_D], method: str, what: str = "the drafter's", vocab: bool = False) -> _D:
    """The job's drafter, checked to be a ``kind`` whose hidden size (and ``vocab``: vocabulary) is the
    target's, on the job's device in the target's dtype: every learned drafter's first step."""
    draft, cfg = job.drafter, job.target.config
    if not isinstance(draft, kind):
        raise ValueError(f"method {method!r} needs a {kind.__name__} as its drafter, got {type(draft).__name__}")
    sizes = [("hidden_size", cfg.hidden_size)] + ([("vocab_size", cfg.vocab_size)] if vocab else [])
    if any(getattr(draft, k) != v for k, v in sizes):
        ours, theirs = (" and ".join(x) for x in zip(*((f"{k} {getattr(draft, k)}", str(v)) for k, v in sizes)))
        verb = "is" if len(sizes) == 1 else "are"
        raise ValueError(f"method {method!r}: {what} {ours} {verb} not the target's {theirs}")
    return draft.to(device=job.device, dtype=next(job.target.parameters()).dtype)


def draft_in_prefill(job: DecodeJob) -> bool:
    """The job's ``draft_in_prefill`` option as the flag speculative_decode takes."""
    return bool(job.option("draft_in_prefill", "off") == "on")


#: the option of every method that verifies drafts: keep them at a fixed rate instead, to time
#: the system at a chosen acceptance (:mod:`specstudy.synthetic`; benchmark-only)
SYNTHETIC = "synthetic_acceptance"


def synthetic_acceptance(job: DecodeJob) -> SyntheticAcceptance | None:
    """The job's synthetic-acceptance rule (parsed here too, for jobs built without ``check``)."""
    value = job.option(SYNTHETIC)
    return None if value is None else parse_synthetic(value)


def chain_decode(
    job: DecodeJob, drafter: Any, generator: torch.Generator, gamma_policy: Any = None, prefill: bool = False
) -> list[Any]:
    """The chain loop (:func:`specstudy.engine.speculate.speculative_decode`) over the job's prompts with
    ``drafter``: γ fixed at the job's unless ``gamma_policy`` says otherwise, the job's synthetic-acceptance
    rule, and a first draft from the prompt where ``prefill`` (the methods that take ``draft_in_prefill``)."""
    return speculative_decode(
        job.target,
        drafter,
        job.prompts,
        job.sampling,
        gamma_policy if gamma_policy is not None else StaticGamma(job.draft_length),
        generator,
        job.eos_token_ids,
        job.device,
        prefill,
        synthetic_acceptance(job),
    )


def synthetic_methods() -> list[str]:
    """Methods that take :data:`SYNTHETIC` (imports their modules: called on errors only)."""
    return [m for m in method_names() if SYNTHETIC in get_method(m).options]
