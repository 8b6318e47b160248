"""The pydantic schemas of a study file's ``study:`` section (shape, types and ranges).

:mod:`specstudy.config.study_matrix` resolves a validated :class:`StudySpec` into the sweeps of a
:class:`~specstudy.config.study_matrix.StudyConfig`; relations between parts are :mod:`.checks`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    field_validator,
    model_validator,
)

from ..frameworks import drafter_methods, method_families
from ..records import Sampling
from .errors import not_allowed
from .vocab import DTYPES, METHOD_FAMILIES, QUANTIZATIONS, method_family

NOTEBOOKS = ("hardware", "method_family", "task_category", "when_it_fails", "report")


def _as_list(v: Any) -> Any:
    return v if isinstance(v, list) or v is None else [v]


def _rate(v: Any) -> Any:
    if isinstance(v, str) and v.lower() == "inf":
        return math.inf
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
        raise not_allowed(v, "positive requests/s or 'inf'")
    return float(v)


_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)
Rate = Annotated[float, BeforeValidator(_rate)]


# --------------------------------------------------------------------------------------------
# the file's parts


class SamplingSpec(BaseModel):
    """Sampling settings, identical for every method and its paired baseline."""

    model_config = _STRICT
    temperature: NonNegativeFloat = 0.0
    top_p: float = 1.0
    top_k: NonNegativeInt = 0
    seed: NonNegativeInt = 0
    ignore_eos: bool = True

    @field_validator("top_p")
    @classmethod
    def _top_p(cls, v: float) -> float:
        if not 0.0 < v <= 1.0:
            raise not_allowed(v, "a number in (0, 1]")
        return v

    def sampling(self, max_new_tokens: int) -> Sampling:
        return Sampling(max_new_tokens=max_new_tokens, **self.model_dump())


class WarmupSpec(BaseModel):
    model_config = _STRICT
    requests: NonNegativeInt = 1
    max_new_tokens: PositiveInt = 8
    #: tokens of a warm-up on an engine this run has already warmed up (another method, γ or batch
    #: size on the same loaded engine); None: ``max_new_tokens``.  The first warm-up of a CPU engine
    #: needs full length; a later method's first decodes are not slow (measured: see cpu.yaml).
    warm_engine_max_new_tokens: PositiveInt | None = None

    @model_validator(mode="before")
    @classmethod
    def _count(cls, v: Any) -> Any:
        return {"requests": v} if isinstance(v, int) and not isinstance(v, bool) else v


class PrecisionSpec(BaseModel):
    """A precision target instead of a fixed n: prompts are added to a speculative cell and its
    paired baseline, ``step`` at a time, until the paired speedup's 95 % interval half-width is at
    most ``rel_half_width`` of the speedup or the cell has ``max_prompts`` distinct prompts.  The
    sweep's ``prompts_per_task`` is the minimum n, ``min_prompts`` the rule's first look (no row stops
    on its interval with fewer: the sequential rule's coverage, simulated in tests/run/test_precision_rule.py),
    and ``budget_s`` the seconds of extension cells the sweep's rows may spend, the widest interval first."""

    model_config = _STRICT
    rel_half_width: Annotated[float, Field(gt=0.0, lt=1.0)]
    max_prompts: PositiveInt
    step: PositiveInt = 4
    min_prompts: PositiveInt = 10
    budget_s: PositiveFloat | None = None


#: named SLOs (``slo: {preset: NAME}``; keys given beside it override the preset's)
SLO_PRESETS: dict[str, dict[str, Any]] = {
    # the seed's FAQ Q1: TPOT <= 50 ms for comfortable chat (the median request)
    "seed-chat": {"tpot_ms": 50.0, "percentile": 50.0},
    # MLPerf Inference's interactive scenario for Llama-3.1-8B: p99 TTFT <= 500 ms, p99 TPOT <= 30 ms
    "mlperf-llama3.1-8b-interactive": {"ttft_ms": 500.0, "tpot_ms": 30.0, "percentile": 99.0},
}


class Slo(BaseModel):
    """The serving SLOs goodput counts against: a request is good when it meets every one given.
    The default is the seed's comfortable-chat figure, TPOT ≤ 50 ms; ``tpot_ms: null`` drops it.
    A study's ``slo`` block, the serving driver's and the analysis' SLO alike.  ``percentile`` is
    what capacity under the SLO reads (the run holds when that percentile of each latency is within
    its limit); ``preset`` names one of :data:`SLO_PRESETS`."""

    model_config = _STRICT
    preset: str | None = None
    ttft_ms: PositiveFloat | None = None
    tpot_ms: PositiveFloat | None = 50.0
    e2e_ms: PositiveFloat | None = None
    percentile: Annotated[float, Field(gt=0.0, le=100.0)] = 90.0

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, v: Any) -> Any:
        if not isinstance(v, dict) or v.get("preset") is None:
            return v
        if v["preset"] not in SLO_PRESETS:
            raise not_allowed(v["preset"], sorted(SLO_PRESETS), at="preset")
        base = {"ttft_ms": None, "tpot_ms": None, "e2e_ms": None, **SLO_PRESETS[v["preset"]]}
        return {**base, **v}

    @model_validator(mode="after")
    def _some(self) -> Slo:
        if self.ttft_ms is None and self.tpot_ms is None and self.e2e_ms is None:
            raise not_allowed(None, "at least one of ttft_ms, tpot_ms, e2e_ms", "goodput needs an SLO")
        return self

    @property
    def ttft_s(self) -> float | None:
        return None if self.ttft_ms is None else self.ttft_ms / 1e3

    @property
    def tpot_s(self) -> float | None:
        return None if self.tpot_ms is None else self.tpot_ms / 1e3

    @property
    def e2e_s(self) -> float | None:
        return None if self.e2e_ms is None else self.e2e_ms / 1e3

    def describe(self) -> str:
        """``TTFT ≤ 500 ms and TPOT ≤ 50 ms``: the SLOs a good request meets."""
        given = (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms), ("E2E", self.e2e_ms))
        return " and ".join(f"{name} ≤ {v:g} ms" for name, v in given if v is not None)

    def describe_percentile(self) -> str:
        """``p99 TTFT ≤ 500 ms and p99 TPOT ≤ 30 ms``: what capacity under the SLO holds to."""
        given = (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms), ("E2E", self.e2e_ms))
        p = f"p{self.percentile:g}"
        return " and ".join(f"{p} {name} ≤ {v:g} ms" for name, v in given if v is not None)


class ModelPair(BaseModel):
    """A target and the drafters usable with it (short name -> model id, path or head id)."""

    model_config = _STRICT
    name: str = ""
    target: Annotated[str, Field(min_length=1)]
    dtype: Literal[DTYPES] = "float32"  # type: ignore[valid-type]
    tensor_parallel_size: PositiveInt = 1
    drafters: dict[str, str] = {}
    params: dict[str, PositiveFloat] = {}  # parameter counts, for the cost model
    vocab_size: dict[str, PositiveInt] = {}  # declared, when no config is reachable
    quantization: Literal[QUANTIZATIONS] = "none"  # type: ignore[valid-type]

    @model_validator(mode="before")
    @classmethod
    def _default_name(cls, v: Any) -> Any:
        if isinstance(v, dict) and "name" not in v and isinstance(v.get("target"), str):
            return {**v, "name": v["target"].split("/")[-1]}
        return v

    @model_validator(mode="after")
    def _known_counts(self) -> ModelPair:
        for key in ("params", "vocab_size"):
            unknown = set(getattr(self, key)) - {"target"} - set(self.drafters)
            if unknown:
                raise not_allowed(sorted(unknown)[0], ["target", *sorted(self.drafters)], at=key)
        return self


class MethodSpec(BaseModel):
    """One method variant (a table row): engine method name, family, label, drafter, options."""

    model_config = _STRICT
    family: Literal[METHOD_FAMILIES]  # type: ignore[valid-type]
    label: Annotated[str, Field(min_length=1)]
    method: str = ""  # the name the backend runs (cell.method)
    drafter: str | None = None
    options: dict[str, Any] = {}
    gammas: tuple[PositiveInt, ...] | None = None  # overrides the sweep's γ values for this method
    max_batch_size: PositiveInt | None = None
    frameworks: tuple[str, ...] | None = None
    optional: bool = False  # dropped (with a warning) when its drafter file is not there

    @model_validator(mode="before")
    @classmethod
    def _names(cls, v: Any) -> Any:
        if isinstance(v, str):
            v = {"method": v}
        if not isinstance(v, dict):
            return v
        known = list(METHOD_FAMILIES) + sorted(method_families())  # the catalogue now (a method added since import)
        method = v.get("method", v.get("family"))
        if method not in known:
            raise not_allowed(method, known, at="method")
        v = {"family": method_family(method), "label": method, **v, "method": method}
        for key in ("gammas", "frameworks"):
            if key in v:
                v[key] = tuple(_as_list(v[key]) or ())
        return v

    @model_validator(mode="after")
    def _drafter_needed(self) -> MethodSpec:
        if self.method in drafter_methods() and not self.drafter:
            raise not_allowed(
                self.drafter,
                "a drafter short name from study.models[].drafters",
                f"method {self.method} needs a drafter",
                at="drafter",
            )
        return self


class _Axes(BaseModel):
    """The axes a sweep may override (and the top level sets for every sweep)."""

    model_config = _STRICT
    frameworks: Annotated[list[str], BeforeValidator(_as_list)] | None = None
    tasks: Annotated[list[str], BeforeValidator(_as_list)] | None = None
    gammas: Annotated[list[PositiveInt], BeforeValidator(_as_list)] | None = None
    batch_sizes: Annotated[list[PositiveInt], BeforeValidator(_as_list)] | None = None
    request_rates: Annotated[list[Rate], BeforeValidator(_as_list)] | None = None
    #: how requests arrive at a server: poisson (at request_rates), trace (a trace task's recorded
    #: times); with trace, both run at the trace's mean rate, so the two read side by side
    arrivals: Annotated[list[Literal["poisson", "trace"]], BeforeValidator(_as_list)] | None = None
    repeats: PositiveInt | None = None
    sampling: Annotated[list[SamplingSpec], BeforeValidator(_as_list)] | None = None  # one setting or an axis of them
    max_new_tokens: PositiveInt | None = None
    prompts_per_task: PositiveInt | None = None
    prefix_cache: Annotated[list[bool], BeforeValidator(_as_list)] | None = None
    precision: PrecisionSpec | None = None


class SweepSpec(_Axes):
    models: Annotated[list[str], BeforeValidator(_as_list)] | None = None
    #: a capacity sweep's first rates as factors of the service rate this machine measured in the sweep's
    #: own closed-loop probe (its batch size, its prompts), not a grid written for another machine
    rates_from_service: Annotated[list[PositiveFloat], BeforeValidator(_as_list), Field(min_length=1)] | None = None
    methods: (
        Annotated[list[str], BeforeValidator(lambda v: v if v == "all" else _as_list(v))] | Literal["all"] | None
    ) = None
    description: str = ""


class StudySpec(_Axes):
    name: str | None = None
    device: str = "cpu"
    models: Annotated[list[ModelPair], Field(min_length=1)]
    methods: Annotated[list[MethodSpec], Field(min_length=1)] = [MethodSpec(family="ar", label="ar", method="ar")]
    framework_options: dict[str, dict[str, Any]] = {}
    warmup: WarmupSpec = WarmupSpec()
    telemetry_period_s: PositiveFloat = 0.5
    #: an A/A control per framework: its first offline AR cell at batch 1 measured against itself
    aa_control: bool = False
    #: a precision target for the A/A controls (the measurement's own precision: prompts added to each
    #: control and its AR baseline like a headline row's, in time beside each other)
    aa_precision: PrecisionSpec | None = None
    #: a group of cells measured in time on a busy machine is measured once more, all arms, when it took
    #: at most this many seconds (0: never); what stays busy is flagged as before
    busy_rerun_budget_s: NonNegativeFloat = 0.0
    #: the seconds a run's cells may take: the planned cells always run; precision extensions and busy-machine
    #: reruns start only when expected to end within it, so a slower machine spends less on them (None: no limit)
    cells_budget_s: PositiveFloat | None = None
    #: per server framework, how many of its servers (one per configuration) may be held at once so that
    #: an AR cell and its speculative cells alternate prompt by prompt across them (1: cell after cell)
    servers_in_time: dict[str, PositiveInt] = {}
    slo: Slo = Slo()
    # engines whose own step costs are measured after the cells (llama.cpp: T(k)/T(1) and c)
    engine_costs: Annotated[list[Literal["llamacpp"]], BeforeValidator(_as_list)] = []
    notebooks: Annotated[list[Literal[NOTEBOOKS]], BeforeValidator(_as_list)] = list(NOTEBOOKS)  # type: ignore[valid-type]
    sweeps: dict[str, SweepSpec | None] | None = None
