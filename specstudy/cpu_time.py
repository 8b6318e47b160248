"""Whose CPU time: the machine's, and the study's own process tree's, so other work can be told apart.

The telemetry sampler stamps both on every sample; their difference over a cell is the cores other
processes used while it ran (the busy rule's measure: the load average counts the kit's own engine).
Only psutil, imported where it is read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psutil


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v


def machine_busy_s() -> float | None:
    """CPU seconds every core of the machine has spent running anything since boot (/proc/stat: user,
    nice, system, irq, softirq; not idle, iowait or steal)."""
    import psutil

    try:
        t = psutil.cpu_times()
    except Exception:
        return None
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0))


def tree_cpu_s(root: psutil.Process) -> float | None:
    """CPU seconds of ``root`` and every process below it (the engines and servers the study started),
    the children they have reaped included: a process that exits between two samples moves its time
    into its parent's, so the sum only grows."""
    import psutil

    total = 0.0
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return None
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.Error:  # exited since the listing: its time is in its parent's reaped children
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def _per_second(
    samples: Sequence[Mapping[str, Any]], seconds: Callable[[Mapping[str, Any]], float | None]
) -> float | None:
    """The growth of a cumulative CPU-seconds reading per second of wall time, first to last sample
    (None under two samples that have it)."""
    pts = sorted((s["t_s"], v) for s in samples if _num(s.get("t_s")) and (v := seconds(s)) is not None)
    if len(pts) < 2 or pts[-1][0] - pts[0][0] <= 0:
        return None
    return float((pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0]))


def _study_s(s: Mapping[str, Any]) -> float | None:
    return float(s["cpu_study_s"]) if _num(s.get("cpu_study_s")) else None


def _others_s(s: Mapping[str, Any]) -> float | None:
    both = _num(s.get("cpu_machine_busy_s")) and _num(s.get("cpu_study_s"))
    return float(s["cpu_machine_busy_s"] - s["cpu_study_s"]) if both else None


def others_cores(samples: Sequence[Mapping[str, Any]]) -> float | None:
    """Mean cores used outside the study's process tree over the samples: the machine's CPU time less
    the study's, over the wall time between the first and last sample (None under two samples; never
    negative: a study process reaped by another parent takes its time with it)."""
    rate = _per_second(samples, _others_s)
    return None if rate is None else max(0.0, rate)


def study_cores(samples: Sequence[Mapping[str, Any]]) -> float | None:
    """Mean cores the study's process tree used over the samples (None under two samples)."""
    return _per_second(samples, _study_s)
