"""How the two arms of a paired comparison were measured: how far apart in time, in which order, and
what the A/A control (AR paired with AR the same way) says about the measurement itself.

A drift of the machine between the AR run and the speculative run lands in the speedup; the runner
times the arms side by side where one engine serves both (:mod:`specstudy.run.paired_in_time`).  The
A/A control goes through exactly that pairing, so its speedup is the measurement's own bias on this
machine and its interval its precision: it must read 1x within its interval.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .. import intervals, metrics
from ..records import PAIRED_IN_TIME, RequestRecord
from . import validity
from .study_records import Study

NAN = float("nan")


@dataclass(frozen=True)
class ArmsApart:
    """The pairs' median time between the starts of the two arms (seconds) and how they were timed:
    ``in_time`` (every pair side by side), ``cell_after_cell``, ``mixed`` or ``unknown`` (the report words it)."""

    median_s: float = NAN
    order: str = "unknown"


def arms_apart(pairs: Iterable[tuple[RequestRecord, RequestRecord]]) -> ArmsApart:
    """How far apart the (baseline, speculative) pairs were started, and in which order."""
    gaps, kinds = [], set()
    for b, s in pairs:
        if b.start_epoch and s.start_epoch:
            gaps.append(abs(s.start_epoch - b.start_epoch))
        kinds.add("in_time" if (s.extra or {}).get("pairing") == PAIRED_IN_TIME else "cell_after_cell")
    if not gaps:
        return ArmsApart()
    return ArmsApart(float(statistics.median(gaps)), kinds.pop() if len(kinds) == 1 else "mixed")


@dataclass(frozen=True)
class ControlRow:
    """One framework's A/A control: AR against AR through a speculative row's pairing."""

    cell_id: str
    framework: str
    task: str
    speedup: float
    ci: tuple[float, float]
    half_width: float  # the interval's half-width relative to the speedup
    n_prompts: int
    apart: ArmsApart
    flagged: bool  # its own validity findings or its baseline's

    @property
    def excludes_one(self) -> bool:
        """Its interval leaves out 1x: the measurement itself is biased here (a drift, a warm-up)."""
        lo, hi = self.ci
        return lo == lo and hi == hi and not lo <= 1.0 <= hi


def control_rows(study: Study) -> list[ControlRow]:
    """The study's A/A controls, one per framework that has one, in framework order: a control and its
    precision extensions (``aa_precision``) pooled into one row, each cell beside its own baseline."""
    cells: dict[str, list[str]] = {}
    for cid, recs in study.controls.items():
        cells.setdefault(recs[0].framework, []).append(cid)
    out = []
    for fw in sorted(cells):
        ids = sorted(cells[fw], key=lambda c: min(r.start_epoch or 0.0 for r in study.controls[c]))  # the planned first
        base_ids = [study.controls[c][0].baseline_cell_id or "" for c in ids]
        base: Sequence[RequestRecord] = [r for b in base_ids for r in study.records.get(b, [])]
        recs = [
            r for c in ids for r in study.controls[c] if study.records.get(study.controls[c][0].baseline_cell_id or "")
        ]
        if not base or not recs:
            continue
        sp = metrics.paired_speedup(base, recs)
        ci = (sp["ci_low"], sp["ci_high"])
        own = [f for f in validity.assess({c: study.controls[c] for c in ids}) if f.flags]
        out.append(
            ControlRow(
                cell_id=ids[0],
                framework=fw,
                task=recs[0].task,
                speedup=sp["speedup"],
                ci=ci,
                half_width=intervals.relative_half_width(sp["speedup"], ci),
                n_prompts=int(sp["n_prompts"]),
                apart=arms_apart(metrics.paired_records(base, recs)),
                flagged=bool(own) or any(b in study.flags for b in base_ids),
            )
        )
    return out
