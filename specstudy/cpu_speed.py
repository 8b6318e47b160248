"""This CPU's two ceilings, measured on the spot: copy bandwidth and fp32 matmul throughput.

A CPU hardware profile with ``measure: true`` takes its bandwidth and peak from here; the engine
benchmark reads the copy at the model's size too.
"""

from __future__ import annotations

import os
import time

_CPU_CACHE: dict[str, float] = {}


def copy_bandwidth_gbps(nbytes: int, repeats: int = 3) -> float:
    """Best-of-``repeats`` GB/s (bytes read + written) of one copy of ``nbytes`` with torch's
    current threads: past the last-level cache when ``nbytes`` is the size of the model, where
    :func:`measure_cpu`'s 64 MiB copy may still fit in a large L3."""
    import torch

    a = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
    b = torch.empty_like(a)
    best = 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        b.copy_(a)
        best = max(best, 2 * a.numel() * 4 / (time.perf_counter() - t0) / 1e9)
    return best


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
