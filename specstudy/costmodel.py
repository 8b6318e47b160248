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
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Callable, Sequence

from .metrics import expected_tau

DTYPE_BYTES = {"fp32": 4.0, "float32": 4.0, "fp16": 2.0, "float16": 2.0, "bf16": 2.0, "bfloat16": 2.0,
               "fp8": 1.0, "int8": 1.0, "int4": 0.5, "q4": 0.5625}


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
    return expected_tau(alpha, gamma) / (gamma * c + 1.0)


def speedup_with_verify_cost(alpha: float, gamma: int, c: float, verify_ratio: float) -> float:
    """Like :func:`leviathan_speedup` but a verification step costs ``verify_ratio`` target steps."""
    return expected_tau(alpha, gamma) / (gamma * c + verify_ratio)


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
    best = (1, -math.inf)
    for g in range(1, max_gamma + 1):
        if verify_ratio is None:
            v = 1.0
        elif callable(verify_ratio):
            v = verify_ratio(g)
        else:
            v = verify_ratio[min(g, len(verify_ratio) - 1)]
        s = speedup_with_verify_cost(alpha, g, c, v)
        if s > best[1] + 1e-12:
            best = (g, s)
    return best


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
    tau: float
    verify_ratio: float
    speedup: float
    leviathan_speedup: float
    speculative_tokens_per_s: float
    regime: str

    def as_dict(self) -> dict:
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
) -> Prediction:
    """Baseline tokens/s, c, τ, optimal (or given) γ and speedup of one configuration.

    Without ``draft_params`` (draft-free methods such as n-gram lookup) c defaults to 0 unless
    given.  The verification cost T(batch, γ+1)/T(batch, 1) comes from the roofline.
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha!r}: must lie in [0, 1]")
    n = n_devices or min_gpus(target_params, dtype, hw)
    t1 = step_time(target_params, hw, dtype, batch, 1, n)
    if c is None:
        c = step_time(draft_params, hw, dtype, batch, 1, n) / t1 if draft_params else 0.0
    td = c * t1
    ratio = lambda g: step_time(target_params, hw, dtype, batch, g + 1, n) / t1  # noqa: E731
    if gamma is None:
        gamma, sp = optimal_gamma(alpha, c, max_gamma, ratio)
    else:
        sp = speedup_with_verify_cost(alpha, gamma, c, ratio(gamma))
    bytes_t = target_params * dtype_bytes(dtype) / (hw.memory_bandwidth_gbps * 1e9 * hw.bandwidth_efficiency * n)
    regime = "memory-bound" if bytes_t + hw.step_overhead_ms * 1e-3 >= t1 - 1e-15 else "compute-bound"
    base_tps = batch / t1
    return Prediction(
        hardware=hw.name, target_params=target_params, draft_params=draft_params, dtype=dtype,
        batch=batch, n_devices=n, alpha=alpha, target_step_s=t1, draft_step_s=td if draft_params else None,
        baseline_tokens_per_s=base_tps, c=c, gamma=gamma, tau=expected_tau(alpha, gamma),
        verify_ratio=ratio(gamma), speedup=sp, leviathan_speedup=leviathan_speedup(alpha, gamma, c),
        speculative_tokens_per_s=base_tps * sp, regime=regime,
    )


def break_even_batch(
    hw: HardwareProfile, target_params: float, draft_params: float | None, alpha: float, gamma: int,
    dtype: str = "bf16", n_devices: int | None = None, max_batch: int = 4096,
) -> int | None:
    """Smallest power-of-two batch at which the predicted speedup drops below 1 (None if never)."""
    b = 1
    while b <= max_batch:
        if predict(hw, target_params, draft_params, alpha, dtype, b, gamma, n_devices).speedup < 1.0:
            return b
        b *= 2
    return None
