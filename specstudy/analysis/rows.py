"""The report's table rows as values: each row's key fields and the :class:`~.stats.Pooled` it rests on.

Why: a row turned into a dict of strings (or of ``dataclasses.asdict``) loses its type, so what
the summary quotes ("AL 2.00") could no longer be followed to where AL is defined.  Here a row
keeps its ``Pooled``; :mod:`specstudy.report` makes every string from it, and :func:`raw_frame`
gives the numbers behind a table (its CSV) in the columns they always had.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..config.vocab import METHOD_FAMILIES
from .drafts import Bend, model_bends, pooled_drafts
from .stats import NAN, Pooled, isnum, pooled, predicted_for
from .study_records import Study

Pool = Callable[[Study, list[str]], Pooled]


def headline_max_new(study: Study) -> Any:
    """The most common max_new_tokens: short-output cells (FAQ Q4) stay out of headline tables."""
    cnt = Counter(study.meta(c)["max_new_tokens"] for c in study.records)
    return cnt.most_common(1)[0][0] if cnt else None


def sweep_or_all(study: Study, sweep: str | None) -> str | None:
    """``sweep`` where the study ran it, else None (every cell)."""
    return sweep if sweep is None or study.has_sweep(sweep) else None


@dataclass(frozen=True)
class HardwareRow:
    """One row of the hardware table (and of the metric table beside it): batch 1, headline length."""

    framework: str
    method: str
    label: str
    model: str
    drafter: str  # "" when the method drafts without a model of its own
    gamma: int  # 0 for AR
    sampling: str
    precision: str
    cells: tuple[str, ...]
    pooled: Pooled

    @property
    def is_ar(self) -> bool:
        return self.method == "ar"

    def record(self) -> dict[str, Any]:
        """The row's numbers as its CSV line: key fields, then every field of its ``Pooled``."""
        keys = ("framework", "method", "label", "model", "drafter", "gamma", "sampling", "precision")
        return {**{k: getattr(self, k) for k in keys}, **self.pooled.record()}


def hardware_groups(study: Study, sweep: str | None = "hardware") -> dict[tuple[Any, ...], list[str]]:
    """Batch-1 cells at the headline output length, one group per table row."""
    sweep = sweep_or_all(study, sweep)
    mnt = headline_max_new(study)
    groups: dict[tuple[Any, ...], list[str]] = {}
    for c in study.cell_ids(sweep, batch_size=1):
        m = study.meta(c)
        if m["max_new_tokens"] == mnt:
            key = (m["framework"], m["method"], m["label"], m["model"], m["drafter"] or "", m["gamma"] or 0)
            groups.setdefault((*key, m["sampling"]), []).append(c)
    return groups


def hardware_rows(study: Study, sweep: str | None = "hardware", pool: Pool = pooled) -> list[HardwareRow]:
    """The hardware table's rows in its order (framework, family, label, γ, sampling), each pooled by ``pool``.

    One row per (framework, method label, drafter, γ, sampling), pooled over the sweep's tasks; AR
    rows pool the baseline cells.
    """
    groups = hardware_groups(study, sweep)
    order = {f: i for i, f in enumerate(METHOD_FAMILIES)}
    rows = []
    for key in sorted(groups, key=lambda k: (k[0], order.get(k[1], 9), k[2], k[5], k[6])):
        fw, method, label, model, drafter, gamma, sampling = key
        cells = groups[key]
        prec = study.meta(cells[0])["precision"]
        rows.append(
            HardwareRow(fw, method, label, model, drafter, gamma, sampling, prec, tuple(cells), pool(study, cells))
        )
    return rows


def vouched_numbers(whole: Sequence[HardwareRow], clean: Sequence[HardwareRow]) -> list[HardwareRow]:
    """The table's rows (``whole``) with the numbers of their unflagged cells (``clean``: the rows of
    :func:`~specstudy.analysis.study_records.vouched`, what the summary reads) wherever a row has any, so a
    row never says two things; each keeps its own cells (a row that pooled a flagged cell is still marked),
    and a row whose every cell is flagged keeps the numbers of them all."""

    def key(r: HardwareRow) -> tuple[Any, ...]:
        return (r.framework, r.method, r.label, r.model, r.drafter, r.gamma, r.sampling)

    by_key = {key(r): r for r in clean}
    return [dataclasses.replace(by_key[key(r)], cells=r.cells) if key(r) in by_key else r for r in whole]


@dataclass(frozen=True)
class Prediction:
    """The cost model's speedup for a measured row, measured / predicted, and which of the model's
    assumptions the row bends (none without a prediction)."""

    speedup: float = NAN
    ratio: float = NAN
    bends: tuple[Bend, ...] = ()

    @classmethod
    def of(cls, p: Pooled, gamma: Any) -> Prediction:
        pred = predicted_for(p, gamma)
        ratio = p.paired.speedup / pred if isnum(pred) and pred > 0 and isnum(p.paired.speedup) else NAN
        return cls(pred, ratio, model_bends(p, gamma, ratio) if isnum(pred) else ())


@dataclass(frozen=True)
class MethodRow:
    """One row of a method family's table: a (framework, label, γ, batch, drafter, sampling) and its numbers."""

    framework: str
    label: str
    gamma: int
    batch_size: int
    drafter: str
    sampling: str
    cells: tuple[str, ...]
    pooled: Pooled
    prediction: Prediction

    def record(self) -> dict[str, Any]:
        """The row's CSV line: key fields, the prediction, then every field of its ``Pooled`` (the report
        words the prediction's note beside ``predicted_speedup``)."""
        keys = ("framework", "label", "gamma", "batch_size", "drafter", "sampling")
        pred = {"predicted_speedup": self.prediction.speedup}
        return {**{k: getattr(self, k) for k in keys}, **pred, **self.pooled.record()}


def family_cells(study: Study, family: str, sweep: str | None) -> list[str]:
    """The family's speculative cells at the headline output length, from ``sweep`` where it ran there."""
    sweep = sweep_or_all(study, sweep)
    mnt = headline_max_new(study)
    cells = [c for c in study.spec_cell_ids(sweep, family=family) if study.meta(c)["max_new_tokens"] == mnt]
    if not cells and sweep is not None:  # a family measured only in other sweeps (e.g. the hardware table)
        cells = [c for c in study.spec_cell_ids(None, family=family) if study.meta(c)["max_new_tokens"] == mnt]
    return cells


def method_rows(study: Study, family: str, sweep: str | None = "method_family") -> list[MethodRow]:
    """The family's rows, sorted by key, each with its draft mix (for the cost model) and its prediction."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for c in family_cells(study, family, sweep):
        m = study.meta(c)
        key = (m["framework"], m["label"], m["gamma"] or 0, m["batch_size"], m["drafter"] or "", m["sampling"])
        groups.setdefault(key, []).append(c)
    rows = []
    for key in sorted(groups):
        p = pooled_drafts(study, groups[key])
        rows.append(MethodRow(*key, cells=tuple(groups[key]), pooled=p, prediction=Prediction.of(p, key[2])))
    return rows


def raw_frame(rows: Sequence[HardwareRow] | Sequence[MethodRow]) -> pd.DataFrame:
    """The numbers behind a table, one line per row (what its CSV holds)."""
    records: Iterable[dict[str, Any]] = (r.record() for r in rows)
    return pd.DataFrame(list(records))
