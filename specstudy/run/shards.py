"""The study matrix split into shards: the units of work a cluster job runs.

A shard holds cells of one engine (framework, model, dtype, tensor-parallel size), so weights are
fetched and engines built on one node and each engine configuration loads once within it; every
speculative cell lands in the same shard as its paired AR baseline (same node, GPU and engine
version).  Pairing groups (a baseline and the cells paired with it) are packed in plan order
until the dry run's predicted minutes reach ``shard_fill`` of the partition's time limit.  The
split depends only on the plan and the cluster settings, so a rerun finds the same shards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..config import ParamsError, ParamsProblems, StudyConfig
from ..config.cluster import ClusterSpec
from ..costmodel import HardwareProfile
from ..layout import StudyLayout
from .dryrun import estimate_cell, setup_seconds
from .plan import CellPlan


@dataclass
class Shard:
    """Cells of one engine that one job runs, with what the job asks the scheduler for."""

    name: str
    plans: list[CellPlan]
    predicted_s: float
    gpus: int
    cells_without_prediction: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def cell_ids(self) -> list[str]:
        return [p.cell_id for p in self.plans]

    def missing(self, layout: StudyLayout) -> list[str]:
        """The shard's cells with no record part on disk (what a rerun runs)."""
        return [cid for cid in self.cell_ids if not layout.is_done(cid)]

    def row(self, cluster: ClusterSpec, layout: StudyLayout | None = None) -> dict[str, Any]:
        p = self.plans[0]
        out = {
            "shard": self.name,
            "framework": p.cell.framework,
            "model": p.target,
            "cells": len(self.plans),
            "predicted_minutes": round(self.predicted_s / 60, 1),
            "gpus": self.gpus,
            "cpus": cluster.cpus_per_task,
            "time_limit_min": cluster.time_limit_min,
            "partition": cluster.partition or "(default)",
        }
        if layout is not None:
            out["missing"] = len(self.missing(layout))
        return out


def engine_of(p: CellPlan) -> tuple[Any, ...]:
    """What a shard never mixes: the engine (framework, model, dtype, tensor-parallel size)."""
    return (p.cell.framework, p.target, p.dtype, p.tensor_parallel_size)


def pairing_groups(plans: Sequence[CellPlan]) -> list[list[CellPlan]]:
    """Each AR baseline with the speculative cells paired with it, in plan order (never split)."""
    groups: dict[str, list[CellPlan]] = {}
    for p in plans:
        groups.setdefault(p.baseline_cell_id or p.cell_id, []).append(p)
    for g in groups.values():  # the baseline first, as the runner needs it
        g.sort(key=lambda p: not p.is_baseline)
    return list(groups.values())


def _gpus(cfg: StudyConfig, p: CellPlan, prof: HardwareProfile | None) -> int:
    """GPUs a job of this engine asks for: its tensor-parallel size on a GPU profile, none on a CPU one."""
    cuda = prof.kind == "gpu" if prof is not None else cfg.device.startswith("cuda")
    return p.tensor_parallel_size if cuda else 0


def plan_shards(
    cfg: StudyConfig, plans: Sequence[CellPlan], prof: HardwareProfile | None, cluster: ClusterSpec
) -> list[Shard]:
    """The shards of ``plans``; raises one :class:`ParamsProblems` with every group that cannot fit.

    Without a profile (a study file outside params/hardware) nothing is predicted: one shard per engine.
    """
    budget = cluster.time_limit_min * 60 * cluster.shard_fill
    rank = {p.cell_id: i for i, p in enumerate(plans)}
    by_engine: dict[tuple[Any, ...], list[list[CellPlan]]] = {}
    for g in pairing_groups(plans):
        by_engine.setdefault(engine_of(g[0]), []).append(g)
    shards: list[Shard] = []
    problems: list[ParamsError] = []
    for engine, groups in by_engine.items():
        gpus = _gpus(cfg, groups[0][0], prof)
        if gpus > cluster.gpus_per_node:
            problems.append(
                ParamsError(
                    cfg.file,
                    "cluster.gpus_per_node",
                    cluster.gpus_per_node,
                    f"at least {gpus}",
                    f"{engine[1]} on {engine[0]} runs tensor-parallel over {gpus} GPUs of one node",
                )
            )
        current: list[CellPlan] = []
        for g in groups:
            secs = _seconds(cfg, [*current, *g], prof)
            if current and secs > budget:
                shards.append(_shard(cfg, len(shards), current, prof, gpus, rank))
                current = []
            current = [*current, *g]
            if _seconds(cfg, current, prof) > budget:
                problems.append(
                    ParamsError(
                        cfg.file,
                        "cluster.time_limit_min",
                        cluster.time_limit_min,
                        f"at least {math.ceil(_seconds(cfg, current, prof) / 60 / cluster.shard_fill)}",
                        f"the cells paired with baseline {g[0].cell_id} ({len(g)} cells) are predicted at "
                        f"{_seconds(cfg, current, prof) / 60:.0f} min and cannot be split",
                    )
                )
        if current:
            shards.append(_shard(cfg, len(shards), current, prof, gpus, rank))
    if problems:
        raise ParamsProblems(problems, "shards of the study against the cluster's settings")
    return shards


def _seconds(cfg: StudyConfig, plans: Sequence[CellPlan], prof: HardwareProfile | None) -> float:
    """Predicted seconds of one job running ``plans``: its cells and its engine loads and server starts."""
    if prof is None:
        return 0.0
    return sum(estimate_cell(cfg, p, prof).seconds or 0.0 for p in plans) + setup_seconds(cfg, plans, prof)


def _shard(
    cfg: StudyConfig, i: int, plans: list[CellPlan], prof: HardwareProfile | None, gpus: int, rank: dict[str, int]
) -> Shard:
    """Its cells in the plan's own order (a server restarts per speculative configuration, not per pairing group)."""
    plans = sorted(plans, key=lambda q: rank[q.cell_id])
    p = plans[0]
    model = p.target.rsplit("/", 1)[-1]
    unknown = sum(prof is None or estimate_cell(cfg, q, prof).seconds is None for q in plans)
    return Shard(
        name=f"s{i:03d}-{p.cell.framework}-{model}",
        plans=plans,
        predicted_s=_seconds(cfg, plans, prof),
        gpus=gpus,
        cells_without_prediction=unknown,
    )
