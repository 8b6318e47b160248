"""Peak-memory overhead of each speculative method over its paired baseline (FAQ Q4 (4)), read
against what the measurement resolves: the memory table and its sentences."""

from __future__ import annotations

from typing import Any

import pandas as pd

from ..drafter_names import SELF
from . import claims
from .format import fmt
from .stats import isnum, pooled
from .study import Study


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
        if not isnum(p.memory_overhead_bytes):
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
                "overhead": p.memory_overhead_bytes,
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
    return family in ("draft_target", "heads") or own


def memory_groups(study: Study) -> list[dict[str, Any]]:
    """Per (framework, method label): the largest overhead over its cells, the noise it is read against, the reading."""
    rows = _memory_cells(study)
    out = []
    for fw, label in sorted({(r["framework"], r["label"]) for r in rows}):
        g = [r for r in rows if (r["framework"], r["label"]) == (fw, label)]
        top = max(g, key=lambda r: r["overhead"])
        noise = max(r["noise"] for r in g)
        src = ", ".join(sorted({r["source"] for r in g}))
        out.append(
            {
                "framework": fw,
                "label": label,
                "overhead": top["overhead"],
                "noise": noise,
                "source": src,
                "cells": len(g),
                "expects": _expects_memory(top["family"], top["drafter"]),
                "reading": claims.memory_text(top["overhead"], noise, src),
            }
        )
    return out


def memory_overhead(study: Study) -> tuple[pd.DataFrame, list[str]]:
    """Largest measured peak-memory overhead per method, read against the measurement's noise, and the sources."""
    groups = memory_groups(study)
    if not groups:
        return pd.DataFrame(), []
    md = pd.DataFrame(
        [
            {
                "Method": g["label"],
                "Framework": g["framework"],
                "Memory overhead (measured, largest over cells)": g["reading"],
                "noise (MB)": fmt(g["noise"] / 1e6, 1),
                "cells": g["cells"],
            }
            for g in groups
        ]
    )
    src = sorted({r.memory_source for r in study.all_records() if r.memory_source})
    return md, src


def memory_claims(study: Study) -> list[str]:
    """FAQ Q4 (4) per method: a draft model (or heads) should cost memory; n-grams and own layers should not."""
    out = []
    for g in memory_groups(study):
        v = claims.memory_verdict(g["overhead"], g["noise"])
        head = f"{g['label']} ({g['framework']}): {g['reading']}"
        if g["expects"]:
            out.append(
                f"{head}; the seed expects a draft model or heads to cost memory: {claims.memory_phrase(v, g['noise'])}"
            )
        elif v == claims.CANNOT_TELL:
            out.append(f"{head}, as the seed expects of a method without a draft model (within the noise)")
        elif v == claims.OBSERVED:
            out.append(f"{head}: more than the seed expects of a method without a draft model")
        else:
            out.append(head)
    return out
