"""Peak-memory overhead of each speculative method over its paired baseline (FAQ Q4 (4)), read
against what the measurement resolves (:class:`MemoryReading`); the report words it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..drafter_names import SELF
from ..frameworks import extra_weight_families
from . import claims
from .stats import isnum, pooled
from .study_records import Study


def _spec_all(study: Study) -> list[str]:
    return [c for c in study.records if study.meta(c)["method"] != "ar"]


#: the resolution of process-level memory (RSS, NVML) when a study gives no better figure: a few MB of
#: allocator and page granularity.  torch's allocator counts bytes exactly, so it has none.
PROCESS_MEMORY_FLOOR_BYTES = 5e6


def _source_name(sources: set[str]) -> str:
    def one(s: str) -> str:
        return (
            "RSS" if "rss" in s else "NVML device memory" if "nvml" in s else "torch allocator" if "torch" in s else s
        )

    return ", ".join(sorted({one(s) for s in sources})) or "backend"


def _spread(peaks: list[int]) -> float:
    return float(max(peaks) - min(peaks)) if peaks else 0.0


def _memory_cells(study: Study) -> list[dict[str, Any]]:
    """Per speculative cell: its peak-memory overhead over its baseline and what that measurement resolves.

    The noise of a process-level source is the larger of the spread of the baseline's (and the cell's)
    own per-request peaks and :data:`PROCESS_MEMORY_FLOOR_BYTES`.  Every source also gets the largest
    negative overhead measured with it in this study: speculation keeps the target's weights and
    cache and adds its own state, so a cell peaking below its baseline shows that source's noise.
    """
    rows = []
    for c in _spec_all(study):
        p = pooled(study, [c])
        if not isnum(p.cost.memory_overhead_bytes):
            continue
        spec, base = study.records.get(c, []), study.baseline(c)
        src = {r.memory_source for r in spec + base if r.memory_source}
        exact = bool(src) and all(s == "torch_cuda" for s in src)
        peaks = [
            [r.peak_memory_bytes for r in rs if r.status == "ok" and r.peak_memory_bytes is not None]
            for rs in (base, spec)
        ]
        noise = 0.0 if exact else max(PROCESS_MEMORY_FLOOR_BYTES, *(_spread(pk) for pk in peaks))
        m = study.meta(c)
        rows.append(
            {
                "framework": m["framework"],
                "label": m["label"],
                "family": m["family"],
                "drafter": m["drafter"],
                "overhead": p.cost.memory_overhead_bytes,
                "noise": noise,
                "source": _source_name(src),
            }
        )
    for src in {r["source"] for r in rows}:
        worst = max([-r["overhead"] for r in rows if r["source"] == src] + [0.0])
        for r in rows:
            if r["source"] == src:
                r["noise"] = max(r["noise"], worst)
    return rows


def _expects_memory(family: str, drafter: str | None) -> bool:
    """Whether the seed expects the method to cost memory: a draft model or heads of its own (not n-grams
    or the target's own layers)."""
    own = bool(drafter) and not str(drafter).startswith(SELF)
    return family in extra_weight_families() or own


@dataclass(frozen=True)
class MemoryReading:
    """One method's (framework, label) peak-memory overhead: the largest over its cells, read against the
    noise of its source, with the verdict of :func:`~.claims.resolved` (the seed expects it positive)."""

    framework: str
    label: str
    overhead: float  # bytes, speculative peak minus its baseline's
    noise: float  # bytes the measurement cannot resolve
    source: str
    cells: int
    expects: bool  # the seed expects the method to cost memory (a draft model or heads of its own)

    @property
    def verdict(self) -> str:
        return claims.memory_verdict(self.overhead, self.noise)  # decided at the 0.1 MB shown


def memory_groups(study: Study) -> list[MemoryReading]:
    """Per (framework, method label): the largest overhead over its cells and the noise it is read against."""
    rows = _memory_cells(study)
    out = []
    for fw, label in sorted({(r["framework"], r["label"]) for r in rows}):
        g = [r for r in rows if (r["framework"], r["label"]) == (fw, label)]
        top = max(g, key=lambda r: r["overhead"])
        noise = max(r["noise"] for r in g)
        src = ", ".join(sorted({r["source"] for r in g}))
        expects = _expects_memory(top["family"], top["drafter"])
        out.append(MemoryReading(fw, label, top["overhead"], noise, src, len(g), expects))
    return out
