"""Hardware telemetry sampled during each cell, so thermal throttling and load are visible.

A :class:`TelemetrySampler` is a daemon thread that reads, every ``period_s`` seconds, through
pynvml for each NVIDIA GPU: temperature, SM and memory clocks, power, utilisation, memory used,
and the clock-event (throttle) reasons; and through psutil for the host: process RSS, CPU
frequency, CPU utilisation, load average and (where the kernel exposes them) CPU temperatures.
The seed article's hygiene table asks for GPU temperature monitoring during long benchmarks;
on this shared CPU machine the load average is what explains a slow cell.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .cpu_time import machine_busy_s, others_cores, study_cores, tree_cpu_s

if TYPE_CHECKING:
    import pandas as pd
    import psutil

# NVML clock-event reason bits (nvml.h, nvmlClocksEventReason*): stable since NVML 3.
THROTTLE_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
#: reasons that mean the GPU ran slower than it could for thermal or power reasons
PERFORMANCE_THROTTLES = {
    "sw_power_cap",
    "hw_slowdown",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
}
#: a CPU whose clock falls below this share of its highest sampled clock is flagged
CPU_FREQ_DROP = 0.85
#: the machine is busy when other work holds more than this many cores beyond those free for the kit:
#: on the 2-core VM a quiet `make study` ran at load 0.47-1.61 and one busy loop per core beside it
#: at 3.4-4.1, so half a core of slack separates the two with room on both sides.  While a cell ran,
#: the other work is the CPU time of processes outside the study's process tree (quiet VM: 0.0-0.1
#: cores); the load average counts the kit's own threads too, and vLLM's CPU server alone held it
#: at 2.5-2.8 on 2 cores, over the limit with nothing else running
BUSY_LOAD_MARGIN = 0.5
#: mean CPU steal (%) above which a VM's cores were not the kit's: 3.1 % on the quiet VM, cells ran
#: 5x slower at 30 %
BUSY_STEAL_PCT = 10.0


def cpu_cores() -> int:
    """Cores this process may run on (its affinity: a container's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def busy_reasons(
    load_1m: float | None,
    cores: int,
    needed: int,
    *,
    during: bool,
    steal_pct: float | None = None,
    freq_dropped: bool = False,
    gpu_other_procs: int | None = None,
    busy_cores_now: float | None = None,
    others_cores: float | None = None,
) -> list[str]:
    """Why the machine was not fit to measure on, one phrase each (empty: fit).

    ``needed``: the cores the kit's engine and client need (all of a CPU machine's, one on a GPU
    box).  Before any cell the load is other work, which may take ``cores - needed``; while a cell
    ``during`` decodes the load holds the kit's own ``needed`` too, so the limit is ``cores``.
    Either way :data:`BUSY_LOAD_MARGIN` of slack.  ``busy_cores_now`` (the start check): the cores
    busy over the sampling window just taken.  It decides instead of the 1-minute load average,
    which trails by a minute both ways: a `make test` that ended a minute ago still reads 0.8, and a
    busy loop started ten seconds ago reads 0.3.  ``others_cores`` (a cell's telemetry): the mean
    cores used by processes outside the study's process tree while it ran; it decides instead of the
    load average, which holds the kit's own engine (records without it fall back to the load).
    """
    out = []
    limit = (cores if during else max(cores - needed, 0)) + BUSY_LOAD_MARGIN
    where = "while the cell ran" if during else f"before the engine; the kit needs {min(needed, cores)} of them"
    load = "" if load_1m is None or load_1m != load_1m else f" (load average {load_1m:.2f})"
    if others_cores is not None and others_cores == others_cores:
        free = max(cores - needed, 0) + BUSY_LOAD_MARGIN
        if others_cores > free:
            out.append(
                f"{others_cores:.2f} of {cores} cores used outside the study while the cell ran{load}, above {free:.1f}"
            )
    elif busy_cores_now is not None and busy_cores_now == busy_cores_now:
        if busy_cores_now > limit:
            out.append(f"{busy_cores_now:.1f} of {cores} cores busy now{load}, above {limit:.1f} {where}")
    elif load_1m is not None and load_1m == load_1m and load_1m > limit:
        out.append(f"load {load_1m:.2f} on {cores} cores (above {limit:.1f} {where})")
    if steal_pct is not None and steal_pct == steal_pct and steal_pct > BUSY_STEAL_PCT:
        out.append(f"CPU steal {steal_pct:.1f} % (above {BUSY_STEAL_PCT:g} %)")
    if freq_dropped:
        out.append(f"CPU clock fell below {CPU_FREQ_DROP:.0%} of its highest")
    if gpu_other_procs:
        out.append(f"{gpu_other_procs} other process(es) on the GPU")
    return out


def machine_check(needed: int, seconds: float = 0.5) -> list[str]:
    """The machine now, before any engine loads: load, steal over ``seconds``, other GPU users."""
    import psutil

    psutil.cpu_times_percent(interval=None)
    window = psutil.cpu_times_percent(interval=seconds)
    steal = getattr(window, "steal", None)
    cores = cpu_cores()
    idle = window.idle + getattr(window, "iowait", 0.0)
    busy_now = max(0.0, (100.0 - idle) / 100.0 * (psutil.cpu_count() or cores))
    nv = _Nvml()
    try:
        gpu = nv.other_processes()
    finally:
        nv.close()
    return busy_reasons(
        load_average()[0], cores, needed, during=False, steal_pct=steal, gpu_other_procs=gpu, busy_cores_now=busy_now
    )


def decode_throttle_reasons(mask: int) -> list[str]:
    """Names of the NVML clock-event reason bits set in ``mask``."""
    return [name for bit, name in THROTTLE_REASONS.items() if mask & bit]


def load_average() -> tuple[float, float, float]:
    """The 1, 5 and 15 minute load averages (NaN where the OS has none)."""
    try:
        return os.getloadavg()
    except (OSError, AttributeError):  # pragma: no cover - Windows
        nan = float("nan")
        return (nan, nan, nan)


class _Nvml:
    """pynvml handles of the GPUs this process may use (``CUDA_VISIBLE_DEVICES``), or nothing when
    there is no driver or NVML fails: telemetry never fails a cell (``error`` says why it is empty)."""

    def __init__(self, visible: str | None = None) -> None:
        self.handles: list[Any] = []
        self.names: list[str] = []
        self.driver = ""
        self.error = ""
        try:
            import pynvml

            pynvml.nvmlInit()
            self.nv = pynvml
        except Exception as e:
            self.nv, self.error = None, f"{type(e).__name__}: {e}"
            return
        try:
            d = pynvml.nvmlSystemGetDriverVersion()
            self.driver = d.decode() if isinstance(d, bytes) else str(d)
        except Exception:
            pass
        try:
            self._open(pynvml, os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible)
        except Exception as e:  # a GPU fallen off the bus, a driver mismatch: no GPU figures, not a failed cell
            self.handles, self.names, self.error = [], [], f"{type(e).__name__}: {e}"

    def _open(self, nv: Any, visible: str | None) -> None:
        every = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        uuids = [_text(nv.nvmlDeviceGetUUID(h)) for h in every] if visible and not _indices(visible) else []
        for i in visible_devices(visible, len(every), uuids):
            self.handles.append(every[i])
            self.names.append(_text(nv.nvmlDeviceGetName(every[i])))

    def sample(self) -> list[dict[str, Any]]:
        nv = self.nv
        out = []
        readers: tuple[tuple[str, Callable[[Any], Any]], ...] = (
            ("gpu_temp_c", lambda h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
            ("gpu_sm_clock_mhz", lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            ("gpu_mem_clock_mhz", lambda h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            ("gpu_power_w", lambda h: nv.nvmlDeviceGetPowerUsage(h) / 1000.0),
            ("gpu_util_pct", lambda h: nv.nvmlDeviceGetUtilizationRates(h).gpu),
            ("gpu_mem_used_bytes", lambda h: nv.nvmlDeviceGetMemoryInfo(h).used),
            ("gpu_fan_pct", lambda h: nv.nvmlDeviceGetFanSpeed(h)),
            # mJ since the driver loaded (Volta and newer): a cell's energy is its last minus first sample
            ("gpu_energy_mj", lambda h: nv.nvmlDeviceGetTotalEnergyConsumption(h)),
        )
        for i, h in enumerate(self.handles):
            s: dict[str, Any] = {"gpu": i}
            for key, fn in readers:
                try:
                    s[key] = fn(h)
                except Exception:
                    s[key] = None
            mask = None
            for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
                reasons = getattr(nv, name, None)
                if reasons is not None:
                    try:
                        mask = int(reasons(h))
                        break
                    except Exception:
                        continue
            s["gpu_throttle_mask"] = mask
            out.append(s)
        return out

    def other_processes(self) -> int | None:
        """Compute processes on this machine's GPUs that are neither this process nor its children
        (the engines the kit started); None without NVML."""
        if self.nv is None or not self.handles:
            return None
        import psutil

        me = psutil.Process()
        ours = {me.pid, *(c.pid for c in me.children(recursive=True))}
        pids: set[int] = set()
        for h in self.handles:
            try:
                pids |= {p.pid for p in self.nv.nvmlDeviceGetComputeRunningProcesses(h)}
            except Exception:
                return None
        return len(pids - ours)

    def close(self) -> None:
        if self.nv is not None:
            try:
                self.nv.nvmlShutdown()
            except Exception:
                pass


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _indices(visible: str) -> bool:
    return all(p.strip().lstrip("-").isdigit() for p in visible.split(",") if p.strip())


def visible_devices(visible: str | None, count: int, uuids: list[str] | None = None) -> list[int]:
    """NVML indices of the GPUs ``CUDA_VISIBLE_DEVICES`` lets a process see, in its order: unset, all;
    indices or UUIDs (or their prefixes), up to the first that names no GPU (CUDA's rule); empty, none."""
    if visible is None:
        return list(range(count))
    out: list[int] = []
    for part in (p.strip() for p in visible.split(",")):
        if part.lstrip("-").isdigit():
            i = int(part)
        else:
            i = next((k for k, u in enumerate(uuids or []) if part and u.startswith(part)), -1)
        if not 0 <= i < count or i in out:
            break
        out.append(i)
    return out


#: NVML handles for other samplers (the server watch reads memory per GPU with it)
Nvml = _Nvml


RAPL_ROOT = "/sys/class/powercap"


class Rapl:
    """The CPU packages' energy from RAPL (``/sys/class/powercap/intel-rapl:N/energy_uj``), summed and
    unwrapped since construction; ``reason`` says why not when the machine does not expose it (a VM,
    or a kernel that makes the counter root-only): the report says so instead of estimating."""

    def __init__(self, root: str = RAPL_ROOT) -> None:
        self.domains: list[tuple[str, float]] = []  # (energy_uj path, wrap range in uJ)
        self.reason = ""
        try:
            names = sorted(n for n in os.listdir(root) if n.count(":") == 1)  # packages, not their subzones
        except OSError:
            self.reason = f"{root} does not exist (no RAPL on this machine)"
            return
        for n in names:
            path = os.path.join(root, n, "energy_uj")
            try:
                with open(path) as f:
                    int(f.read())
                with open(os.path.join(root, n, "max_energy_range_uj")) as f:
                    self.domains.append((path, float(f.read())))
            except (OSError, ValueError) as e:
                self.reason = f"{path} not readable ({type(e).__name__})"
                self.domains = []
                return
        if not self.domains:
            self.reason = f"{root} has no RAPL package domain"
        self._last = [self._read(p) for p, _ in self.domains]
        self._total_uj = 0.0

    @staticmethod
    def _read(path: str) -> float:
        with open(path) as f:
            return float(f.read())

    def joules(self) -> float | None:
        """Joules since construction (None where unreadable); a counter that wrapped adds its range."""
        if not self.domains:
            return None
        for i, (path, wrap) in enumerate(self.domains):
            try:
                now = self._read(path)
            except (OSError, ValueError):
                return None
            self._total_uj += now - self._last[i] if now >= self._last[i] else now + wrap - self._last[i]
            self._last[i] = now
        return self._total_uj / 1e6


def _host_sample(proc: psutil.Process) -> dict[str, Any]:
    import psutil

    s: dict[str, Any] = {}
    try:
        s["rss_bytes"] = proc.memory_info().rss
    except Exception:
        s["rss_bytes"] = None
    try:
        f = psutil.cpu_freq()
        s["cpu_freq_mhz"] = f.current if f else None
    except Exception:
        s["cpu_freq_mhz"] = None
    s["cpu_util_pct"] = psutil.cpu_percent(interval=None)
    # steal: the share of time a VM's virtual CPUs waited for the host (Linux guests); the same
    # cells ran 5x slower at 30 % steal than at 5 % here, so a pair measured at different steal drifts
    s["cpu_steal_pct"] = getattr(psutil.cpu_times_percent(interval=None), "steal", None)
    s["load_1m"], s["load_5m"], s["load_15m"] = load_average()
    s["cpu_machine_busy_s"] = machine_busy_s()
    s["cpu_study_s"] = tree_cpu_s(proc)
    try:
        temps = psutil.sensors_temperatures() if hasattr(psutil, "sensors_temperatures") else {}
        vals = [t.current for ts in temps.values() for t in ts if t.current]
        s["cpu_temp_c"] = max(vals) if vals else None
    except Exception:
        s["cpu_temp_c"] = None
    return s


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def energy_of(samples: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Joules over a cell's samples: GPUs from NVML's total-energy counter (last − first per GPU,
    summed), CPU packages from RAPL; None where the counter was not readable, with the reason RAPL
    gave (never an estimate from power × time)."""
    by_gpu: dict[Any, list[float]] = {}
    for s in samples:
        if _num(s.get("gpu_energy_mj")):
            by_gpu.setdefault(s.get("gpu"), []).append(float(s["gpu_energy_mj"]))
    cpu = [float(s["cpu_energy_j"]) for s in samples if _num(s.get("cpu_energy_j"))]
    reasons = {str(s["cpu_energy_unavailable"]) for s in samples if s.get("cpu_energy_unavailable")}
    gpu_ok = [v for v in by_gpu.values() if len(v) >= 2]
    return {
        "gpu_energy_j": sum(max(v) - min(v) for v in gpu_ok) / 1e3 if gpu_ok else None,
        "cpu_energy_j": max(cpu) - min(cpu) if len(cpu) >= 2 else None,
        "cpu_energy_unavailable": "; ".join(sorted(reasons)) or None,
    }


@dataclass
class Telemetry:
    """Samples of one cell: one row per (time, device); host fields on every row."""

    period_s: float
    samples: list[dict[str, Any]] = field(default_factory=list)
    gpu_names: list[str] = field(default_factory=list)
    driver: str = ""

    def frame(self) -> pd.DataFrame:
        import pandas as pd

        return pd.DataFrame(self.samples)

    def summary(self) -> dict[str, Any]:
        """Peaks, means and the throttling flag over the cell (None where not measured)."""

        def col(name: str) -> list[Any]:
            return [s[name] for s in self.samples if s.get(name) is not None]

        def agg(name: str, fn: Callable[[list[Any]], Any]) -> Any:
            v = col(name)
            return fn(v) if v else None

        def mean(v: list[float]) -> float:
            return sum(v) / len(v)

        reasons = sorted({r for m in col("gpu_throttle_mask") for r in decode_throttle_reasons(m)})
        perf = sorted(set(reasons) & PERFORMANCE_THROTTLES)
        freqs = col("cpu_freq_mhz")
        cpu_drop = bool(freqs) and min(freqs) < CPU_FREQ_DROP * max(freqs)
        ts = col("t_s")
        return {
            "telemetry_samples": len({s.get("t_s") for s in self.samples}),
            "telemetry_period_s": self.period_s,
            "duration_s": (max(ts) - min(ts)) if ts else 0.0,
            "gpu_names": list(self.gpu_names),
            "gpu_driver": self.driver,
            "gpu_temp_max_c": agg("gpu_temp_c", max),
            "gpu_temp_mean_c": agg("gpu_temp_c", mean),
            "gpu_sm_clock_min_mhz": agg("gpu_sm_clock_mhz", min),
            "gpu_sm_clock_mean_mhz": agg("gpu_sm_clock_mhz", mean),
            "gpu_mem_clock_mean_mhz": agg("gpu_mem_clock_mhz", mean),
            "gpu_power_mean_w": agg("gpu_power_w", mean),
            "gpu_power_max_w": agg("gpu_power_w", max),
            "gpu_util_mean_pct": agg("gpu_util_pct", mean),
            "gpu_mem_used_max_bytes": agg("gpu_mem_used_bytes", max),
            "gpu_throttle_reasons": reasons,
            "gpu_throttled": bool(perf),
            "rss_peak_bytes": agg("rss_bytes", max),
            "cpu_freq_mean_mhz": agg("cpu_freq_mhz", mean),
            "cpu_freq_min_mhz": agg("cpu_freq_mhz", min),
            "cpu_freq_max_mhz": agg("cpu_freq_mhz", max),
            "cpu_freq_dropped": cpu_drop,
            "cpu_util_mean_pct": agg("cpu_util_pct", mean),
            "cpu_steal_mean_pct": agg("cpu_steal_pct", mean),
            "cpu_steal_max_pct": agg("cpu_steal_pct", max),
            "cpu_temp_max_c": agg("cpu_temp_c", max),
            "load_1m_mean": agg("load_1m", mean),
            "cpu_cores": cpu_cores(),
            "gpu_other_procs_max": agg("gpu_other_procs", max),
            "load_1m_max": agg("load_1m", max),
            "cpu_others_cores_mean": others_cores(self.samples),
            "cpu_study_cores_mean": study_cores(self.samples),
            "throttled": bool(perf) or cpu_drop,
            **energy_of(self.samples),
        }


class TelemetrySampler:
    """A background thread sampling GPU (pynvml) and host (psutil) state every ``period_s``.

    Use as a context manager; :attr:`telemetry` holds the samples afterwards.  Sampling costs a
    few NVML calls per period, negligible against a decode step.
    """

    def __init__(self, period_s: float = 0.5, gpus: bool = True) -> None:
        if period_s <= 0:
            raise ValueError(f"period_s={period_s!r}: must be > 0")
        self.period_s = period_s
        self._nvml = _Nvml() if gpus else None
        self.telemetry = Telemetry(
            period_s=period_s,
            gpu_names=list(self._nvml.names) if self._nvml else [],
            driver=self._nvml.driver if self._nvml else "",
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def _sample_once(self) -> None:
        t = time.perf_counter() - self._t0
        host = _host_sample(self._proc)
        host["cpu_energy_j"] = self._rapl.joules()
        if self._rapl.reason:
            host["cpu_energy_unavailable"] = self._rapl.reason
        host["t_s"] = t
        host["epoch"] = time.time()
        gpus = self._nvml.sample() if self._nvml and self._nvml.handles else []
        if gpus:
            host["gpu_other_procs"] = self._nvml.other_processes() if self._nvml else None
            for g in gpus:
                self.telemetry.samples.append({**host, **g})
        else:
            self.telemetry.samples.append(host)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._sample_once()
            except Exception:  # a sensor read failing must never kill the measurement
                pass
            self._stop.wait(self.period_s)

    def start(self) -> TelemetrySampler:
        import psutil

        self._proc = psutil.Process()
        self._rapl = Rapl()
        psutil.cpu_percent(interval=None)  # prime the utilisation counter
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._loop, name="specstudy-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> Telemetry:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 2 * self.period_s))
        try:
            self._sample_once()  # a closing sample so short cells have at least two
        except Exception:
            pass
        if self._nvml is not None:
            self._nvml.close()
        return self.telemetry

    def __enter__(self) -> TelemetrySampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def gpu_names() -> list[str]:
    """Names of the NVIDIA GPUs NVML sees here (empty without a driver)."""
    nv = _Nvml()
    try:
        return list(nv.names)
    finally:
        nv.close()


def host_info() -> dict[str, Any]:
    """Static facts about this machine for provenance: CPU model, cores, memory, GPUs, driver."""
    import platform

    import psutil

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    nv = _Nvml()
    info = {
        "cpu_model": cpu,
        "cpu_cores_logical": psutil.cpu_count(logical=True),
        "cpu_cores_physical": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 1e9, 2),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "gpus": list(nv.names),
        "gpu_driver": nv.driver,
    }
    if nv.nv is not None and nv.handles:
        try:
            info["gpu_max_sm_clock_mhz"] = nv.nv.nvmlDeviceGetMaxClockInfo(nv.handles[0], nv.nv.NVML_CLOCK_SM)
        except Exception:
            pass
    nv.close()
    return info
