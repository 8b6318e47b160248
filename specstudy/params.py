"""Parameter files: YAML loading and validation that fails fast with a precise message.

Every error names the file, the key, the bad value and what is allowed, and is raised before
any model is loaded or any prompt is decoded.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

PACKAGE_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_ROOT.parent


def params_dir() -> Path:
    """Where ``params/`` lives: $SPECSTUDY_PARAMS, else the repository's own folder."""
    return Path(os.environ.get("SPECSTUDY_PARAMS", REPO_ROOT / "params"))


class ParamsError(ValueError):
    """A bad parameter: names file, key, value and the allowed values."""

    def __init__(self, file: str | os.PathLike | None, key: str, value: Any, allowed: Any, hint: str = ""):
        self.file, self.key, self.value, self.allowed = file, key, value, allowed
        where = f"{file}: " if file else ""
        msg = f"{where}{key}={value!r} is not allowed; allowed: {allowed}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


def load_yaml(path: str | os.PathLike) -> dict[str, Any]:
    import yaml

    path = Path(path)
    if not path.exists():
        raise ParamsError(None, "file", str(path), "an existing YAML file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ParamsError(path, "yaml", str(e).splitlines()[0], "valid YAML") from None
    if not isinstance(data, dict):
        raise ParamsError(path, "<top level>", type(data).__name__, "a mapping")
    return data


def check_keys(data: Mapping[str, Any], allowed: Iterable[str], file: Any, prefix: str = "") -> None:
    allowed = sorted(allowed)
    for k in data:
        if k not in allowed:
            raise ParamsError(file, f"{prefix}{k}", k, allowed, "unknown key")


def require(data: Mapping[str, Any], key: str, file: Any, kind: type | tuple[type, ...], prefix: str = "") -> Any:
    if key not in data:
        raise ParamsError(file, f"{prefix}{key}", None, f"a {getattr(kind, '__name__', kind)} (required)")
    v = data[key]
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        raise ParamsError(file, f"{prefix}{key}", v, f"a {getattr(kind, '__name__', kind)}")
    return v


# --------------------------------------------------------------------------------------------
# hardware profiles


@dataclass(frozen=True)
class HardwareProfile:
    """Roofline figures of one device (datasheet values; the cpu profile is measured)."""

    name: str
    device: str
    memory_bandwidth_gbps: float
    peak_tflops_by_dtype: Mapping[str, float]
    memory_gb: float
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
        raise ParamsError(None, "dtype", dtype, sorted(self.peak_tflops_by_dtype))


_PROFILE_KEYS = {"device", "memory_bandwidth_gbps", "peak_tflops", "memory_gb", "bandwidth_efficiency",
                 "compute_efficiency", "step_overhead_ms", "kind", "measure"}


def hardware_names() -> list[str]:
    return sorted(p.stem for p in (params_dir() / "hardware").glob("*.yaml"))


def hardware_file(name: str) -> Path:
    path = params_dir() / "hardware" / f"{name}.yaml"
    if not path.exists():
        raise ParamsError(params_dir() / "hardware", "hardware", name, hardware_names())
    return path


def load_hardware_profile(name: str, measure: bool = True) -> HardwareProfile:
    """The ``profile:`` block of ``params/hardware/<name>.yaml``; a cpu profile is measured here."""
    path = hardware_file(name)
    data = load_yaml(path)
    prof = data.get("profile")
    if not isinstance(prof, dict):
        raise ParamsError(path, "profile", prof, "a mapping with " + ", ".join(sorted(_PROFILE_KEYS)))
    check_keys(prof, _PROFILE_KEYS, path, "profile.")
    kind = prof.get("kind", "gpu")
    if kind not in ("gpu", "cpu"):
        raise ParamsError(path, "profile.kind", kind, ["cpu", "gpu"])
    peaks = prof.get("peak_tflops")
    if not isinstance(peaks, dict) or not peaks:
        raise ParamsError(path, "profile.peak_tflops", peaks, "a mapping dtype -> TFLOP/s")
    bw = prof.get("memory_bandwidth_gbps")
    mem = prof.get("memory_gb")
    source = "datasheet"
    if kind == "cpu" and measure and prof.get("measure", True):
        m = measure_cpu()
        bw, peaks, source = m["copy_bandwidth_gbps"], {"fp32": m["fp32_tflops"], **{k: v for k, v in peaks.items() if k != "fp32"}}, "measured"
        mem = mem or m["memory_gb"]
    for key, v in (("memory_bandwidth_gbps", bw), ("memory_gb", mem)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v <= 0:
            raise ParamsError(path, f"profile.{key}", v, "a positive number")
    return HardwareProfile(
        name=name,
        device=str(prof.get("device", name)),
        memory_bandwidth_gbps=float(bw),
        peak_tflops_by_dtype={k: float(v) for k, v in peaks.items()},
        memory_gb=float(mem),
        bandwidth_efficiency=float(prof.get("bandwidth_efficiency", 0.65)),
        compute_efficiency=float(prof.get("compute_efficiency", 0.6)),
        step_overhead_ms=float(prof.get("step_overhead_ms", 0.2)),
        kind=kind,
        source=source,
    )


_CPU_CACHE: dict[str, float] = {}


def measure_cpu(seconds: float = 0.3) -> dict[str, float]:
    """A short copy benchmark (bytes read + written) and an fp32 matmul: this CPU's two ceilings.

    Taken once per process; best of a few repeats to damp a noisy shared machine.
    """
    if _CPU_CACHE:
        return dict(_CPU_CACHE)
    import numpy as np

    n = 64 * 1024 * 1024 // 8  # 64 MiB of float64, well past the caches
    a = np.ones(n)
    b = np.empty_like(a)
    best_bw = 0.0
    t_end = time.perf_counter() + seconds
    while True:
        t0 = time.perf_counter()
        np.copyto(b, a)
        dt = time.perf_counter() - t0
        best_bw = max(best_bw, 2 * a.nbytes / dt / 1e9)
        if time.perf_counter() > t_end:
            break
    m = np.random.default_rng(0).standard_normal((512, 512)).astype(np.float32)
    best_fl = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        m @ m
        dt = time.perf_counter() - t0
        best_fl = max(best_fl, 2 * 512**3 / dt / 1e12)
    try:
        import psutil

        mem = psutil.virtual_memory().total / 1e9
    except ImportError:  # pragma: no cover
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    _CPU_CACHE.update(copy_bandwidth_gbps=best_bw, fp32_tflops=best_fl, memory_gb=mem)
    return dict(_CPU_CACHE)
