"""What a server does while a run lasts: its memory and its own batch gauges, sampled in threads.

A server's engine lives in other processes, so the client's memory says nothing about it, and the
batch a continuous-batching server actually runs is not the batch the client offers (the seed's
FAQ Q2 asks for the typical batch under continuous batching).  :class:`ServerWatch` samples, for
one run: the server process tree's RSS (the kit started it), NVML memory per GPU (when a driver
is present), and the server's gauges from ``/metrics`` (vLLM ``vllm:num_requests_running`` and
``..._waiting``, its KV-cache usage; llama.cpp ``llamacpp:requests_processing``).  None of these
is guessed: a figure the server does not expose stays None.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..telemetry import Nvml
from .prometheus import MetricSamples, metric_total
from .rss import TreeRssSampler

#: the memory source of a server on GPUs: the devices' used memory, its pre-reserved pool included
SERVER_DEVICE_MEMORY = "nvml_device_incl_reserved_pool"


@dataclass
class WatchResult:
    """One run's samples, reduced to what the records keep."""

    peak_rss_bytes: int | None = None
    rss_samples: int = 0
    device_peak_bytes: list[int] | None = None
    gauge_period_s: float | None = None
    gauges: dict[str, list[float]] = field(default_factory=dict)

    def memory(self) -> tuple[int | None, str | None]:
        """(peak bytes, source): NVML's memory of the GPUs this process sees when there are any, else
        the tree's RSS.  A server reserves its KV pool at start (``gpu_memory_utilization``), so its
        device figure is mostly that reservation, not what the run needed: the source says so."""
        if self.device_peak_bytes:
            return sum(self.device_peak_bytes), SERVER_DEVICE_MEMORY
        if self.peak_rss_bytes is not None:
            return self.peak_rss_bytes, "server_rss"
        return None, None

    def gauge_mean(self, name: str) -> float | None:
        values = self.gauges.get(name) or []
        return sum(values) / len(values) if values else None

    def gauge_max(self, name: str) -> float | None:
        values = self.gauges.get(name) or []
        return max(values) if values else None

    def as_extra(self) -> dict[str, Any]:
        """The run-level block every record of the run carries (``extra["server_watch"]``)."""
        return {
            "peak_rss_bytes": self.peak_rss_bytes,
            "rss_samples": self.rss_samples,
            "device_peak_bytes": self.device_peak_bytes,
            "gauge_period_s": self.gauge_period_s,
            "gauges": {
                k: {"mean": self.gauge_mean(k), "max": self.gauge_max(k), "n": len(v)} for k, v in self.gauges.items()
            },
        }


class _GaugeSampler:
    """Scrapes the server's /metrics and reads NVML per GPU every ``period_s`` in a thread."""

    def __init__(self, scrape: Callable[[], MetricSamples | None] | None, gauges: Mapping[str, str], period_s: float):
        self.scrape, self.names, self.period_s = scrape, dict(gauges), period_s
        self.values: dict[str, list[float]] = {}
        self.device_peak: list[int] | None = None
        self._stop = threading.Event()
        self._nvml = _open_nvml()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="server-gauges")

    def _sample(self) -> None:
        if self.scrape is not None and self.names:
            samples = self.scrape()
            for key, metric in self.names.items():
                v = metric_total(samples, metric) if samples else None
                if v is not None:
                    self.values.setdefault(key, []).append(v)
        if self._nvml is not None:
            used = [s.get("gpu_mem_used_bytes") for s in self._nvml.sample()]
            if used and None not in used:
                now = [int(u) for u in used if u is not None]
                self.device_peak = (
                    now if self.device_peak is None else [max(a, b) for a, b in zip(self.device_peak, now)]
                )

    def _loop(self) -> None:
        while not self._stop.is_set():
            t0 = time.perf_counter()
            self._sample()
            self._stop.wait(max(0.0, self.period_s - (time.perf_counter() - t0)))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._nvml is not None:
            self._nvml.close()


def _open_nvml() -> Any:

    nv = Nvml()
    if not nv.handles:
        nv.close()
        return None
    return nv


class ServerWatch:
    """``with ServerWatch(pid, scrape, gauges) as w: ...`` then ``w.result``.

    ``pid``: the server process the kit started (None when attached: no RSS); ``scrape``: the
    backend's /metrics reader (None: no gauges); ``gauges``: {key: Prometheus metric name}.
    """

    def __init__(
        self,
        pid: int | None,
        scrape: Callable[[], MetricSamples | None] | None = None,
        gauges: Mapping[str, str] | None = None,
        *,
        rss_period_s: float = 0.02,
        gauge_period_s: float = 0.5,
    ):
        if gauge_period_s <= 0:
            raise ValueError(f"gauge_period_s={gauge_period_s!r}: must be > 0")
        self.rss = TreeRssSampler(pid, rss_period_s) if pid is not None else None
        self.gauges = _GaugeSampler(scrape, gauges or {}, gauge_period_s)
        self.result = WatchResult(gauge_period_s=gauge_period_s if gauges else None)

    def __enter__(self) -> ServerWatch:
        if self.rss is not None:
            self.rss.__enter__()
        self.gauges.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.gauges.stop()
        if self.rss is not None:
            self.rss.__exit__(*exc)
            self.result.peak_rss_bytes, self.result.rss_samples = self.rss.peak, self.rss.samples
        self.result.device_peak_bytes = self.gauges.device_peak
        self.result.gauges = self.gauges.values
