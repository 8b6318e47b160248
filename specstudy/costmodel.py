"""Cost model: Leviathan et al. (2023) speedup, optimal γ, and a roofline step-time model.

The roofline model predicts one forward's time on a hardware profile from the parameter count,
dtype, batch size and number of tokens per row the forward processes (1 for plain decoding,
γ+1 for a verification step):

    t = max(weight_bytes / (bandwidth · η_bw),  2 · params · batch · tokens / (peak · η_flop))
        + step_overhead

Decoding small batches is bandwidth-bound, so a verification over γ+1 tokens costs about as much
as one decode step; once batch · (γ+1) tokens push the forward past the ridge point it turns
compute-bound and verification cost grows with γ and batch, which is where speculation stops
paying (the seed article's FAQ Q4 (1)).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from . import metrics
from .metrics import expected_acceptance_length

DTYPE_BYTES = {
    "fp32": 4.0,
    "float32": 4.0,
    "fp16": 2.0,
    "float16": 2.0,
    "bf16": 2.0,
    "bfloat16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "q4": 0.5625,
}


@dataclass(frozen=True)
class HardwareProfile:
    """Roofline figures of one device (datasheet values; the cpu profile is measured)."""

    name: str
    device: str
    memory_bandwidth_gbps: float
    peak_tflops_by_dtype: Mapping[str, float] = field(default_factory=dict)
    memory_gb: float = 0.0
    bandwidth_efficiency: float = 0.65
    compute_efficiency: float = 0.6
    step_overhead_ms: float = 0.2
    kind: str = "gpu"  # "gpu" or "cpu"
    source: str = "datasheet"
    # what renting the machine costs (None: no price stated, so no $ per token); the date and source
    # travel with it because prices move
    price_usd_per_hour: float | None = None
    price_date: str = ""
    price_source: str = ""

    def peak_tflops(self, dtype: str) -> float:
        canon = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "q4": "int4"}.get(dtype, dtype)
        if canon in self.peak_tflops_by_dtype:
            return float(self.peak_tflops_by_dtype[canon])
        if canon in ("int8", "fp8", "int4") and "bf16" in self.peak_tflops_by_dtype:
            return float(self.peak_tflops_by_dtype["bf16"])  # weight-only quantization computes in bf16
        if canon in ("bf16", "fp16") and "fp32" in self.peak_tflops_by_dtype:
            return float(self.peak_tflops_by_dtype["fp32"])
        raise ValueError(f"dtype={dtype!r} has no peak on {self.name}; allowed: {sorted(self.peak_tflops_by_dtype)}")


def dtype_bytes(dtype: str) -> float:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"dtype={dtype!r}: allowed {sorted(DTYPE_BYTES)}") from None


# --------------------------------------------------------------------------------------------
# Leviathan et al.


def leviathan_speedup(alpha: float, gamma: int, c: float) -> float:
    """Expected walltime improvement (1 − α^(γ+1)) / ((1 − α)(γc + 1)).

    c = time of one draft step / time of one target step.  Assumes verification of γ+1 tokens
    costs one target step (the bandwidth-bound regime).
    """
    if c < 0:
        raise ValueError(f"c={c!r}: must be >= 0")
    return expected_acceptance_length(alpha, gamma) / (gamma * c + 1.0)


def draft_cost(gamma: int, c: float, block: bool = False) -> float:
    """One step's drafting in target steps: γ sequential draft forwards of ``c`` each, or, for a
    drafter that drafts the whole block in one forward (DFlash, PARD), one forward whatever γ."""
    return c if block else gamma * c


def speedup_with_verify_cost(alpha: float, gamma: int, c: float, verify_ratio: float, block: bool = False) -> float:
    """Like :func:`leviathan_speedup` but a verification step costs ``verify_ratio`` target steps
    (``block``: the draft cost is one forward per block, :func:`draft_cost`)."""
    return expected_acceptance_length(alpha, gamma) / (draft_cost(gamma, c, block) + verify_ratio)


def optimal_gamma(
    alpha: float,
    c: float,
    max_gamma: int = 16,
    verify_ratio: Callable[[int], float] | Sequence[float] | None = None,
) -> tuple[int, float]:
    """γ in 1..max_gamma maximising the expected speedup; returns (γ, speedup).

    ``verify_ratio`` gives T_target(γ+1 tokens) / T_target(1 token) per γ (a callable, or a
    sequence indexed by γ); None means 1 (Leviathan's assumption).
    """
    v = _verify_fn(verify_ratio)
    return best_gamma(lambda g: speedup_with_verify_cost(alpha, g, c, v(g)), max_gamma)


def _verify_fn(verify_ratio: Callable[[int], float] | Sequence[float] | None) -> Callable[[int], float]:
    """A verification-cost curve given as None (1), a callable or a sequence indexed by γ, as a callable."""
    if verify_ratio is None:
        return lambda g: 1.0
    if callable(verify_ratio):
        return verify_ratio
    seq = verify_ratio
    return lambda g: seq[min(g, len(seq) - 1)]


def best_gamma(speedup_at: Callable[[int], float], max_gamma: int) -> tuple[int, float]:
    """γ in 1..max_gamma with the highest ``speedup_at(γ)`` (the smallest on a tie); returns (γ, speedup)."""
    if max_gamma < 1:
        raise ValueError(f"max_gamma={max_gamma!r}: must be >= 1")
    best = (1, -math.inf)
    for g in range(1, max_gamma + 1):
        s = speedup_at(g)
        if s > best[1] + 1e-12:
            best = (g, s)
    return best


# --------------------------------------------------------------------------------------------
# drafts that vary: the measured draft-length distribution


@dataclass(frozen=True)
class DraftMix:
    """What a measured row's decode steps drafted and accepted, and (where timed) what they cost.

    The Leviathan formula assumes γ tokens drafted every step; prompt lookup drafts only on a
    match, and often fewer than γ.  Counts as in :class:`~specstudy.records.RequestRecord`:
    ``drafted_ge[k-1]`` steps drafted at least k tokens, ``accepted_ge[k-1]`` accepted at least k,
    out of ``decode_steps`` target forwards after the prompt pass (the others drafted nothing).
    ``gamma`` is the draft cap the row ran with: its measured depth.  Costs are in units of the
    paired AR decode step T1, NaN / empty where the engine did not time its steps: ``c`` per
    drafted token (``block``: per draft forward, one per step whatever k — DFlash), ``verify_by_k[k]``
    the mean cost of the verification forward of a step that drafted k (T(k+1)/T(1), the convention
    of :func:`optimal_gamma`), ``no_draft`` the mean cost of a step that drafted nothing (an AR step
    plus the failed lookup).
    """

    decode_steps: int
    drafted_ge: tuple[int, ...]
    accepted_ge: tuple[int, ...]
    gamma: int
    c: float = math.nan
    verify_by_k: Mapping[int, float] = field(default_factory=dict)
    no_draft: float = math.nan
    block: bool = False

    def __post_init__(self) -> None:
        if self.decode_steps < 1 or self.gamma < 1:
            raise ValueError(f"decode_steps={self.decode_steps}, gamma={self.gamma}: each must be >= 1")
        ge = (self.drafted_ge, self.accepted_ge)
        if any(list(x) != sorted(x, reverse=True) or (x and x[-1] < 0) for x in ge):
            raise ValueError(
                f"drafted_ge={self.drafted_ge}, accepted_ge={self.accepted_ge}: need non-increasing counts"
            )
        if len(self.accepted_ge) > len(self.drafted_ge) or any(
            a > d for a, d in zip(self.accepted_ge, self.drafted_ge)
        ):
            raise ValueError(f"accepted_ge={self.accepted_ge} exceeds drafted_ge={self.drafted_ge}")

    @property
    def draft_steps(self) -> int:
        """Decode steps that drafted at least one token."""
        return self.drafted_ge[0] if self.drafted_ge else 0

    @property
    def steps(self) -> int:
        """Decode steps counted: ``decode_steps``, or more where the prompt pass drafted too."""
        return max(self.decode_steps, self.draft_steps)

    @property
    def draft_share(self) -> float:
        """Share of decode steps that drafted (the rest cost an AR step and yield one token)."""
        return self.draft_steps / self.steps

    def steps_drafting(self, gamma: int) -> dict[int, int]:
        """k → decode steps that draft k tokens with the cap at ``gamma``: longer drafts are cut to γ;
        past the measured depth, the steps that drafted the full measured cap draft γ (an upper bound)."""
        g = min(gamma, self.gamma)
        d = list(self.drafted_ge[:g]) + [0] * (g + 1 - len(self.drafted_ge[:g]))
        out = {k: d[k - 1] - d[k] for k in range(1, g)}
        out[gamma] = d[g - 1]  # drafts of g or more: cut to γ, or (past the depth) grown to γ
        return {k: n for k, n in out.items() if n}

    def acceptance_length(self, gamma: int, beyond: float | None = None) -> float:
        """AL of the drafting steps with the cap at ``gamma`` (1 + accepted / draft steps; a step that
        accepted its first γ tokens counts γ).  Past the measured depth the steps that accepted all of
        it accept each further token with probability ``beyond`` (None there: a ValueError)."""
        if not self.draft_steps:
            return math.nan
        g = min(gamma, self.gamma)
        al = metrics.acceptance_length(sum(self.accepted_ge[:g]), self.draft_steps)
        if gamma > self.gamma:
            if beyond is None or not 0.0 <= beyond <= 1.0:
                raise ValueError(
                    f"gamma={gamma} is past the measured depth {self.gamma}: give beyond (the acceptance "
                    f"assumed there, in [0, 1]); got {beyond!r}"
                )
            full = metrics.per_position_unconditional(self.accepted_ge[g - 1 : g], self.draft_steps)
            al += (full[0] if full else 0.0) * sum(beyond**j for j in range(1, gamma - g + 1))
        return al


def mix_speedup(
    mix: DraftMix,
    gamma: int,
    c: float,
    verify: Callable[[int], float],
    no_draft: float = 1.0,
    beyond: float | None = None,
) -> float:
    """Decode-phase speedup of a measured draft mix at cap ``gamma``: tokens per step / cost per step.

    A step drafting nothing yields 1 token at ``no_draft`` (× T1; 1 = an AR step, the lookup ≈ 0);
    a step drafting k yields E[accepted | k] + 1 at c·k + ``verify(k)`` (T(k+1)/T(1)).  So
    s = (1 + share · (AL_γ − 1)) / ((1 − share) · no_draft + Σ_k P(k) (c·k + verify(k))).  With
    every step drafting γ and i.i.d. acceptance this is :func:`speedup_with_verify_cost`.
    """
    if c < 0 or no_draft < 0:
        raise ValueError(f"c={c!r}, no_draft={no_draft!r}: must be >= 0")
    share = mix.draft_share
    tokens = 1.0 + (share * (mix.acceptance_length(gamma, beyond) - 1.0) if share else 0.0)
    cost = (1.0 - share) * no_draft
    cost += sum(n * (draft_cost(k, c, mix.block) + verify(k)) for k, n in mix.steps_drafting(gamma).items()) / mix.steps
    return tokens / cost if cost > 0 else math.nan


# --------------------------------------------------------------------------------------------
# roofline


def min_gpus(params: float, dtype: str, hw: HardwareProfile, headroom: float = 0.9) -> int:
    """Fewest devices (powers of two) whose memory holds the weights with headroom for KV cache."""
    need = params * dtype_bytes(dtype)
    n = 1
    while need > n * hw.memory_gb * 1e9 * headroom:
        n *= 2
        if n > 64:
            raise ValueError(f"{params:.3g} parameters in {dtype} do not fit on 64 × {hw.name}")
    return n


def step_time(
    params: float,
    hw: HardwareProfile,
    dtype: str = "bf16",
    batch: int = 1,
    tokens: int = 1,
    n_devices: int = 1,
) -> float:
    """Predicted seconds for one forward over ``batch`` rows of ``tokens`` new tokens each."""
    if batch < 1 or tokens < 1 or n_devices < 1:
        raise ValueError(f"batch={batch}, tokens={tokens}, n_devices={n_devices}: each must be >= 1")
    bytes_moved = params * dtype_bytes(dtype)
    flops = 2.0 * params * batch * tokens
    bw = hw.memory_bandwidth_gbps * 1e9 * hw.bandwidth_efficiency * n_devices
    peak = hw.peak_tflops(dtype) * 1e12 * hw.compute_efficiency * n_devices
    return max(bytes_moved / bw, flops / peak) + hw.step_overhead_ms * 1e-3


@dataclass
class Prediction:
    hardware: str
    target_params: float
    draft_params: float | None
    dtype: str
    batch: int
    n_devices: int
    alpha: float
    target_step_s: float
    draft_step_s: float | None
    baseline_tokens_per_s: float
    c: float | None
    gamma: int
    acceptance_length: float  # AL(α, γ), or the measured mix's AL at γ: the tokens one verification yields
    verify_ratio: float
    speedup: float
    leviathan_speedup: float
    speculative_tokens_per_s: float
    regime: str
    draft_share: float = 1.0  # share of decode steps that draft (1: Leviathan's every step)
    max_gamma: int = 16  # the largest γ searched
    extrapolated: bool = False  # γ lies past the measured draft depth (acceptance there assumed, α)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def predict(
    hw: HardwareProfile,
    target_params: float,
    draft_params: float | None,
    alpha: float,
    dtype: str = "bf16",
    batch: int = 1,
    gamma: int | None = None,
    n_devices: int | None = None,
    max_gamma: int = 16,
    c: float | None = None,
    mix: DraftMix | None = None,
    beyond: float | None = None,
    block: bool = False,
) -> Prediction:
    """Baseline tokens/s, c, acceptance length AL(α, γ), optimal (or given) γ and speedup of one configuration.

    Without ``draft_params`` (draft-free methods such as n-gram lookup) c defaults to 0 unless
    given.  The verification cost T(batch, γ+1)/T(batch, 1) comes from the roofline.  With a
    measured ``mix`` the speedup is :func:`mix_speedup` (drafts that vary; a step without a draft
    costs one AR step); γ past its measured depth needs ``beyond``, the acceptance assumed there.
    ``block``: a block drafter (DFlash, PARD) costs one draft forward per step, not γ.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha!r}: must lie in [0, 1]")
    n = n_devices or min_gpus(target_params, dtype, hw)
    t1 = step_time(target_params, hw, dtype, batch, 1, n)
    if c is None:
        c = step_time(draft_params, hw, dtype, batch, 1, n) / t1 if draft_params else 0.0
    td = c * t1

    def ratio(g: int) -> float:
        return step_time(target_params, hw, dtype, batch, g + 1, n) / t1

    def speedup(g: int) -> float:
        if mix is None:
            return speedup_with_verify_cost(alpha, g, c, ratio(g), block)
        return mix_speedup(mix, g, c, ratio, 1.0, beyond)

    if gamma is None:
        gamma, sp = best_gamma(speedup, max_gamma)
    else:
        sp = speedup(gamma)
    bytes_t = target_params * dtype_bytes(dtype) / (hw.memory_bandwidth_gbps * 1e9 * hw.bandwidth_efficiency * n)
    regime = "memory-bound" if bytes_t + hw.step_overhead_ms * 1e-3 >= t1 - 1e-15 else "compute-bound"
    base_tps = batch / t1
    return Prediction(
        hardware=hw.name,
        target_params=target_params,
        draft_params=draft_params,
        dtype=dtype,
        batch=batch,
        n_devices=n,
        alpha=alpha,
        target_step_s=t1,
        draft_step_s=td if draft_params else None,
        baseline_tokens_per_s=base_tps,
        c=c,
        gamma=gamma,
        acceptance_length=(
            expected_acceptance_length(alpha, gamma) if mix is None else mix.acceptance_length(gamma, beyond)
        ),
        verify_ratio=ratio(gamma),
        speedup=sp,
        leviathan_speedup=leviathan_speedup(alpha, gamma, c),
        speculative_tokens_per_s=base_tps * sp,
        regime=regime,
        draft_share=1.0 if mix is None else mix.draft_share,
        max_gamma=max_gamma,
        extrapolated=mix is not None and gamma > mix.gamma,
    )


def break_even_batch(
    hw: HardwareProfile,
    target_params: float,
    draft_params: float | None,
    alpha: float,
    gamma: int,
    dtype: str = "bf16",
    n_devices: int | None = None,
    max_batch: int = 4096,
    mix: DraftMix | None = None,
    beyond: float | None = None,
) -> int | None:
    """Smallest power-of-two batch at which the predicted speedup drops below 1 (None if never)."""
    b = 1
    while b <= max_batch:
        pred = predict(hw, target_params, draft_params, alpha, dtype, b, gamma, n_devices, mix=mix, beyond=beyond)
        if pred.speedup < 1.0:
            return b
        b *= 2
    return None


# --------------------------------------------------------------------------------------------
# calibration: fitting the roofline's efficiencies and overhead to measured forward times

#: what ``bench/gpu_check.py`` writes (its docstring documents the whole file)
CALIBRATION_SCHEMA = "specstudy.gpu_check"
CALIBRATION_VERSION = 1


@dataclass(frozen=True)
class MeasuredStep:
    """One timed forward: ``batch`` rows of ``tokens`` new tokens through a model of ``params``."""

    params: float
    dtype: str
    batch: int
    tokens: int
    seconds: float


def _geometric(lo: float, hi: float, n: int) -> list[float]:
    return [lo * (hi / lo) ** (i / (n - 1)) for i in range(n)]


def _fit_overhead(model_s: Sequence[float], measured_s: Sequence[float]) -> tuple[float, float]:
    """The overhead o >= 0 minimising Σ ((m_i + o − t_i) / t_i)² in closed form, and that sum."""
    w = [1.0 / t**2 for t in measured_s]
    o = max(0.0, sum((t - m) * wi for m, t, wi in zip(model_s, measured_s, w)) / sum(w))
    return o, sum(((m + o - t) / t) ** 2 for m, t in zip(model_s, measured_s))


def fit_roofline(
    steps: Sequence[MeasuredStep], hw: HardwareProfile, eta_min: float = 0.02, grid: int = 41
) -> dict[str, Any]:
    """η_bw, η_flop and step overhead that make :func:`step_time` match measured forwards.

    Model: t_i = max(B_i / η_bw, F_i / η_flop) + o with B_i = weight bytes / datasheet bandwidth
    and F_i = 2 · params · batch · tokens / datasheet peak (seconds at efficiency 1).  Fit:
    least squares of the *relative* error over a geometric grid of (η_bw, η_flop) in
    [``eta_min``, 1], refined twice around the best cell, with o >= 0 in closed form at each.
    An efficiency is ``identified`` only when the points constrain it: η_flop needs
    compute-bound points, η_bw memory-bound points of at least two model sizes (one size cannot
    tell η_bw from the overhead); an unidentified value sits on the grid's edge.
    """
    if len(steps) < 3:
        raise ValueError(f"fit_roofline needs >= 3 measured steps; got {len(steps)}")
    for s in steps:
        if not (s.seconds > 0 and math.isfinite(s.seconds)) or s.params <= 0 or s.batch < 1 or s.tokens < 1:
            raise ValueError(f"measured step {s}: need seconds > 0 (finite), params > 0, batch and tokens >= 1")
    mem = [s.params * dtype_bytes(s.dtype) / (hw.memory_bandwidth_gbps * 1e9) for s in steps]
    flo = [2.0 * s.params * s.batch * s.tokens / (hw.peak_tflops(s.dtype) * 1e12) for s in steps]
    t = [s.seconds for s in steps]

    def loss(eb: float, ec: float) -> tuple[float, float]:
        o, sq = _fit_overhead([max(a / eb, f / ec) for a, f in zip(mem, flo)], t)
        return sq, o

    cells = [(eb, ec) for eb in _geometric(eta_min, 1.0, grid) for ec in _geometric(eta_min, 1.0, grid)]
    best = min(cells, key=lambda c: loss(*c)[0])
    step = (1.0 / eta_min) ** (1.0 / (grid - 1))
    for _ in range(2):  # refine inside the neighbouring cells
        around = [
            (min(1.0, max(eta_min, best[0] * step ** (i / 5))), min(1.0, max(eta_min, best[1] * step ** (j / 5))))
            for i in range(-5, 6)
            for j in range(-5, 6)
        ]
        best = min(around, key=lambda c: loss(*c)[0])
        step = step**0.2
    sq, o = loss(*best)
    eb, ec = best
    compute_bound = [f / ec > a / eb for a, f in zip(mem, flo)]
    sizes = sorted({s.params for s, cb in zip(steps, compute_bound) if not cb})
    rel = [abs(max(a / eb, f / ec) + o - ti) / ti for a, f, ti in zip(mem, flo, t)]

    def inside(v: float) -> bool:
        return eta_min * 1.001 < v < 0.999

    return {
        "bandwidth_efficiency": eb,
        "compute_efficiency": ec,
        "step_overhead_ms": o * 1e3,
        "rms_rel_error": math.sqrt(sq / len(t)),
        "max_rel_error": max(rel),
        "points": len(t),
        "compute_bound_points": sum(compute_bound),
        "memory_bound_points": len(t) - sum(compute_bound),
        "identified": {
            "bandwidth": len(sizes) >= 2 and sizes[-1] >= 2 * sizes[0] and inside(eb),
            "compute": sum(compute_bound) >= 2 and inside(ec),
        },
    }


def load_calibration(path: str) -> dict[str, Any]:
    """The ``calibration`` block of a ``bench/gpu_check.py`` JSON, schema and version checked."""
    import json
    from pathlib import Path

    p = Path(path)
    if not p.exists():
        raise ValueError(f"calibration file {str(p)!r} does not exist (write one with bench/gpu_check.py --out)")
    data = json.loads(p.read_text())
    got = (data.get("schema"), data.get("version"))
    if got != (CALIBRATION_SCHEMA, CALIBRATION_VERSION):
        raise ValueError(f"{str(p)!r}: schema/version {got!r}; allowed: {(CALIBRATION_SCHEMA, CALIBRATION_VERSION)!r}")
    cal = data.get("calibration")
    if not isinstance(cal, dict):
        raise ValueError(f"{str(p)!r}: no 'calibration' block (the run ended before its fit)")
    return cal


def calibrated_profile(hw: HardwareProfile, calibration: dict[str, Any]) -> HardwareProfile:
    """``hw`` with the measured efficiencies and step overhead of a calibration of that device.

    Refused unless the calibration names ``hw`` and was measured on it (``usable``: a CUDA run
    with real shapes, not a ``--tiny`` CPU run).
    """
    if calibration.get("profile") != hw.name:
        raise ValueError(f"calibration of profile {calibration.get('profile')!r} applied to {hw.name!r}")
    if not calibration.get("usable"):
        raise ValueError(
            f"calibration for {hw.name!r} is not usable: {calibration.get('why_not', 'not measured on it')}"
        )
    fields = {k: float(calibration[k]) for k in ("bandwidth_efficiency", "compute_efficiency", "step_overhead_ms")}
    for k, v in fields.items():
        if not math.isfinite(v) or v < 0 or (k != "step_overhead_ms" and not 0 < v <= 1):
            raise ValueError(f"calibration {k}={v!r}: need a finite value in (0, 1] (step_overhead_ms: >= 0)")
    return replace(
        hw,
        bandwidth_efficiency=fields["bandwidth_efficiency"],
        compute_efficiency=fields["compute_efficiency"],
        step_overhead_ms=fields["step_overhead_ms"],
        source=f"measured {calibration.get('date', '')}".strip(),
    )
