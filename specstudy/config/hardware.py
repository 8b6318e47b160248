"""The ``profile:`` block of ``params/hardware/<name>.yaml``: the roofline figures of one device.

GPU profiles hold datasheet values (calibrated where a lent machine measured them).  The cpu
profile is measured on the spot (a copy benchmark and a matmul, :func:`cpu_speed.measure_cpu`)
when ``measure: true``; the runner saves the profile it used into the outputs folder so the
report predicts with the same figures.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat

from ..costmodel import HardwareProfile
from ..cpu_speed import measure_cpu
from .errors import ParamsError, validate
from .files import hardware_file, load_yaml


class PriceSpec(BaseModel):
    """What the profile's machine costs to rent, with when and where that price was read."""

    model_config = ConfigDict(extra="forbid", strict=True)

    usd_per_hour: PositiveFloat
    date: str = Field(pattern=r"^\d{4}-\d{2}(-\d{2})?$")
    source: str = Field(min_length=1)


class ProfileSpec(BaseModel):
    """The YAML block; every key is checked, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", strict=True)

    device: str = ""
    kind: Literal["gpu", "cpu"] = "gpu"
    measure: bool = True
    memory_bandwidth_gbps: PositiveFloat
    peak_tflops: dict[str, PositiveFloat]
    memory_gb: PositiveFloat
    bandwidth_efficiency: PositiveFloat = 0.65
    compute_efficiency: PositiveFloat = 0.6
    step_overhead_ms: float = 0.2
    price: PriceSpec | None = None


def load_hardware_profile(name: str, measure: bool = True) -> HardwareProfile:
    """The profile ``name``; a cpu profile with ``measure: true`` is measured here (once per process)."""
    path = hardware_file(name)
    data = load_yaml(path)
    if not isinstance(data.get("profile"), dict):
        raise ParamsError(
            path, "profile", data.get("profile"), "a mapping with " + ", ".join(sorted(ProfileSpec.model_fields))
        )
    spec: ProfileSpec = validate(ProfileSpec, data["profile"], path, "profile.")
    if not spec.peak_tflops:
        raise ParamsError(path, "profile.peak_tflops", spec.peak_tflops, "a mapping dtype -> TFLOP/s")
    bw, peaks, mem, source = spec.memory_bandwidth_gbps, dict(spec.peak_tflops), spec.memory_gb, "datasheet"
    if spec.kind == "cpu" and measure and spec.measure:
        m = measure_cpu()
        bw, source = m["copy_bandwidth_gbps"], "measured"
        peaks = {"fp32": m["fp32_tflops"], **{k: v for k, v in peaks.items() if k != "fp32"}}
        mem = mem or m["memory_gb"]
    return HardwareProfile(
        name=name,
        device=spec.device or name,
        memory_bandwidth_gbps=float(bw),
        peak_tflops_by_dtype={k: float(v) for k, v in peaks.items()},
        memory_gb=float(mem),
        bandwidth_efficiency=spec.bandwidth_efficiency,
        compute_efficiency=spec.compute_efficiency,
        step_overhead_ms=spec.step_overhead_ms,
        kind=spec.kind,
        source=source,
        price_usd_per_hour=spec.price.usd_per_hour if spec.price else None,
        price_date=spec.price.date if spec.price else "",
        price_source=spec.price.source if spec.price else "",
    )
