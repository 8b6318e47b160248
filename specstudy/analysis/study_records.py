"""A finished (or partly finished) study, loaded once: its records by cell and what each cell is.

Every table, figure and notebook starts from :func:`load`.  A cell's description (framework,
method, family, label, task, γ, batch, sweeps, baseline, ...) is read from its records' own
columns; parts written before the runner stamped those columns get them from the plan snapshot,
once, here.  Cells on disk that the current plan no longer has are set aside (``stale_cells``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..config import hardware_names, load_hardware_profile
from ..config.vocab import method_family
from ..costmodel import HardwareProfile
from ..frameworks import DECLARATIONS
from ..frameworks.declaration import engine_schedule
from ..layout import StudyLayout
from ..records import CONTROL_FAMILY, RequestRecord
from . import validity

#: what describes a cell (one row of :func:`specstudy.analysis.frames.cells_frame`)
CELL_FIELDS = (
    "cell_id",
    "framework",
    "method",
    "family",
    "label",
    "task",
    "model",
    "drafter",
    "gamma",
    "batch_size",
    "repeat",
    "max_new_tokens",
    "prefix_cache",
    "request_rate",
    "dtype",
    "precision",
    "sampling",
    "synthetic",
    "sweeps",
    "baseline_cell_id",
)


#: the sampling key of greedy decoding
GREEDY = "greedy"


def sampling_key(temperature: float, top_p: float, top_k: int) -> str:
    """``greedy`` or ``T0.7_p0.9_k40``: how a cell sampled, as an identifier that groups cells (identical
    for a method and its baseline); :func:`specstudy.report.format.sampling_text` words it."""
    if temperature == 0.0:
        return GREEDY
    parts = ["T" + format(temperature, "g")]
    parts += ["p" + format(top_p, "g")] if top_p < 1.0 else []
    parts += ["k" + str(top_k)] if top_k else []
    return "_".join(parts)


def _measured(cell: dict[str, Any], r: RequestRecord) -> dict[str, Any]:
    """Fields every cell has from its records alone: how it sampled, at what precision, synthetic or not."""
    return {
        **cell,
        "sampling": sampling_key(r.temperature, r.top_p, r.top_k),
        "precision": str(r.extra.get("precision") or cell["dtype"]),
        "synthetic": r.synthetic_acceptance,
        # a rate cell's arrivals: its trace task's recorded times, else Poisson at its rate
        "arrivals": r.extra.get("arrivals", "poisson") if cell.get("request_rate") is not None else None,
    }


def _engine_schedule(framework: str, plan: dict[str, Any] | None) -> str | None:
    """The engine's own γ schedule the planned cell ran (its declaration's schedule options), or None."""
    decl = DECLARATIONS.get(framework)
    opts = dict(((plan or {}).get("cell") or {}).get("options") or [])
    return engine_schedule(decl, opts) if decl else None


def _describe(cell_id: str, recs: list[RequestRecord], plan: dict[str, Any] | None) -> dict[str, Any]:
    """The cell's fields: its records' columns, else (parts from before the runner stamped them) the plan's;
    and the engine's own γ schedule when its plan set one."""
    described = _describe_cell(cell_id, recs, plan)
    return {**described, "engine_schedule": _engine_schedule(described["framework"], plan)}


def _describe_cell(cell_id: str, recs: list[RequestRecord], plan: dict[str, Any] | None) -> dict[str, Any]:
    r = recs[0]
    if r.label or not plan:
        return _measured(
            {
                "cell_id": cell_id,
                "framework": r.framework,
                "method": r.method,
                "family": r.family or method_family(r.method),
                "label": r.label or r.method,
                "task": r.task,
                "model": r.model,
                "drafter": r.drafter,
                "gamma": r.gamma,
                "batch_size": r.batch_size,
                "repeat": r.repeat,
                "max_new_tokens": r.max_new_tokens,
                "prefix_cache": r.prefix_cache,
                "request_rate": r.request_rate,
                "dtype": r.dtype or "—",
                "sweeps": tuple(r.sweeps),
                "baseline_cell_id": r.baseline_cell_id,
            },
            r,
        )
    cell = plan.get("cell") or {}
    opts = dict(cell.get("options") or [])
    return _measured(
        {
            "cell_id": cell_id,
            "framework": cell.get("framework", r.framework),
            "method": cell.get("method", r.method),
            "family": plan.get("family") or method_family(cell.get("method", r.method)),
            "label": plan.get("label", r.method),
            "task": cell.get("task", r.task),
            "model": cell.get("model", r.model),
            "drafter": cell.get("drafter", r.drafter),
            "gamma": cell.get("gamma", r.gamma),
            "batch_size": cell.get("batch_size", r.batch_size),
            "repeat": cell.get("repeat", r.repeat),
            "max_new_tokens": opts.get("max_new_tokens", r.max_new_tokens),
            "prefix_cache": opts.get("prefix_cache", False),
            "request_rate": opts.get("request_rate"),
            "dtype": str(opts.get("dtype", "—")),
            "sweeps": tuple(plan.get("sweeps") or ()),
            "baseline_cell_id": plan.get("baseline_cell_id"),
        },
        r,
    )


@dataclass
class Study:
    """One ``outputs/<gpu>/`` folder: records grouped by cell, each cell described, the plan, telemetry."""

    layout: StudyLayout
    hardware: str
    records: dict[str, list[RequestRecord]]
    cells: dict[str, dict[str, Any]]
    plan: dict[str, Any]
    provenance: dict[str, Any]
    failed: list[dict[str, Any]]
    telemetry: Any = None  # pandas frame or None
    stale_cells: list[str] = field(default_factory=list)
    profile: HardwareProfile | None = None
    engine_costs: list[dict[str, Any]] = field(default_factory=list)  # engines' own step-cost measurements
    #: every validity check's findings (:mod:`specstudy.analysis.validity`), and the cells they leave
    #: out of verdicts: cell id -> why (its own flags or its baseline's)
    findings: list[Any] = field(default_factory=list)
    flags: dict[str, tuple[validity.Reason, ...]] = field(default_factory=dict)
    #: the A/A control cells' records (AR paired with AR), kept apart from every table of methods:
    #: :mod:`specstudy.analysis.control` reads them with their baselines
    controls: dict[str, list[RequestRecord]] = field(default_factory=dict)

    @property
    def out(self) -> Path:
        return self.layout.root

    @property
    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = self.plan.get("config", {})
        return config

    @property
    def planned_cells(self) -> int:
        return len(self.plan.get("cells", [])) or len(self.records)

    def meta(self, cell_id: str) -> dict[str, Any]:
        return self.cells[cell_id]

    def cell_ids(self, sweep: str | None = None, **where: Any) -> list[str]:
        """Finished cells, optionally of one sweep and matching ``where`` fields (a value or a collection).

        ``sweep`` names a table's sweep: ``hardware`` takes the cells of ``hardware`` and of every
        ``hardware_<part>`` sweep (a study may split one table's rows over several sweeps, say its
        repeated headline rows, its other method families and its T > 0 rows).
        """
        out = []
        for cid, m in self.cells.items():
            if sweep is not None and not any(s == sweep or s.startswith(sweep + "_") for s in m["sweeps"]):
                continue
            if all((m[k] in v) if isinstance(v, (list, tuple, set)) else m[k] == v for k, v in where.items()):
                out.append(cid)
        return sorted(out)

    def spec_cell_ids(self, sweep: str | None = None, **where: Any) -> list[str]:
        return [c for c in self.cell_ids(sweep, **where) if self.cells[c]["method"] != "ar"]

    def sweeps(self) -> list[str]:
        return sorted({s for m in self.cells.values() for s in m["sweeps"]})

    def has_sweep(self, sweep: str) -> bool:
        """Whether some cell is in ``sweep`` or one of its ``<sweep>_<part>`` siblings."""
        return any(s == sweep or s.startswith(sweep + "_") for s in self.sweeps())

    def baseline(self, cell_id: str) -> list[RequestRecord]:
        b = self.cells[cell_id]["baseline_cell_id"]
        return self.records.get(b, []) if b else []

    def all_records(self) -> Iterable[RequestRecord]:
        return (r for rs in self.records.values() for r in rs)

    def model_params(self) -> dict[str, float]:
        """Parameter counts declared in the study's model pairs (target id / drafter id -> count)."""
        out: dict[str, float] = {}
        for pair in self.config.get("models", []):
            params = pair.get("params") or {}
            if "target" in params:
                out[pair["target"]] = float(params["target"])
            for short, mid in (pair.get("drafters") or {}).items():
                if short in params:
                    out[mid] = float(params[short])
        return out

    def model_pair(self, target: str) -> dict[str, Any] | None:
        return next((p for p in self.config.get("models", []) if p.get("target") == target), None)


def _profile(layout: StudyLayout, hardware: str) -> HardwareProfile | None:
    """The profile the runner saved; for folders from before that, the profile file's own figures
    (never measured here: loading results has no side effects, and this machine is not the one
    that ran them)."""
    saved = layout.load_profile()
    if saved is not None or hardware not in hardware_names():
        return saved
    try:
        return load_hardware_profile(hardware, measure=False)
    except (ValueError, OSError):
        return None


def load(out: str | os.PathLike[str]) -> Study:
    """Read every finished part, the plan snapshot, telemetry, provenance, failed cells and the profile."""
    layout = StudyLayout(Path(out))
    recs = layout.read_records()
    plan = layout.read_plan()
    plans = {c["cell_id"]: c for c in plan.get("cells", [])}
    stale = sorted(set(recs) - set(plans)) if plans else []
    for cid in stale:  # parts of cells no longer in the params (the plan changed since they ran)
        del recs[cid]
    controls = {cid: recs.pop(cid) for cid in [c for c, rs in recs.items() if rs and rs[0].family == CONTROL_FAMILY]}
    hardware = plan.get("hardware") or (next(iter(recs.values()))[0].hardware if recs else layout.root.name)
    runs = layout.provenance_runs()
    tel = layout.read_telemetry()
    if tel is not None and stale and "cell_id" in tel:
        tel = tel[~tel["cell_id"].isin(stale)]
    failed = [f for f in layout.failed_cells() if not plans or f.get("cell_id") in plans]
    cells = {cid: _describe(cid, rs, plans.get(cid)) for cid, rs in recs.items()}
    findings = validity.assess(recs)
    return Study(
        layout=layout,
        hardware=hardware,
        records=recs,
        cells=cells,
        plan=plan,
        provenance=runs[-1] if runs else {},
        failed=failed,
        telemetry=tel,
        stale_cells=stale,
        profile=_profile(layout, hardware),
        engine_costs=layout.read_engine_costs(),
        findings=findings,
        flags=validity.flagged(findings, {c: m["baseline_cell_id"] for c, m in cells.items()}),
        controls=controls,
    )


def vouched(study: Study) -> Study:
    """The study without its flagged cells: what verdicts, the summary and best-method lines read."""
    keep = [c for c in study.records if c not in study.flags]
    return dataclasses.replace(
        study, records={c: study.records[c] for c in keep}, cells={c: study.cells[c] for c in keep}, flags={}
    )
