"""Tree shapes at a matched node budget: chain, fixed branching, SpecInfer-merged and Sequoia trees
on the same drafter(s), measured AL beside the AL each shape's own model expects.

The expected AL is a prediction, labelled as one: Sequoia's dynamic program gives it for the tree
it chose (``extra["sequoia_expected_al"]``, from the calibrated acceptance vector); a chain's is
Leviathan et al.'s (1 − α̂^(γ+1)) / (1 − α̂) from the row's own i.i.d. α̂; a SpecInfer merge's (greedy) is
what its drafters would reach if they were independent, each at its own measured depth
(:func:`independent_merge_al`), so the gap to the measured AL is how much the drafters agree; the other
shapes have no closed form here and say so.  Every measured figure is pooled over the row's prompts with its
interval (:func:`specstudy.analysis.stats.pooled`); n counts distinct prompts.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any

import pandas as pd

from ..frameworks import eagle_methods, tree_methods
from ..metrics import expected_acceptance_length
from .stats import Pooled, isnum, pooled
from .study_records import Study

#: the sweep whose rows this table reads (and its ``tree_shapes_<part>`` siblings)
SWEEP = "tree_shapes"


def is_dynamic_tree(records: Any) -> bool:
    """Whether these records ran EAGLE-2's dynamic tree (the engine notes it in each record's extra)."""
    return any(getattr(r, "extra", {}).get("tree") == "eagle2_dynamic" for r in records)


def _extras(study: Study, cells: list[str], key: str) -> list[Any]:
    return [r.extra[key] for c in cells for r in study.records.get(c, []) if r.status == "ok" and key in r.extra]


def _records(study: Study, cells: list[str]) -> list[Any]:
    return [r for c in cells for r in study.records.get(c, []) if r.status == "ok"]


def _options(study: Study, cell_id: str) -> dict[str, Any]:
    """The cell's method options, from the plan snapshot the runner wrote."""
    for c in study.plan.get("cells", []):
        if c.get("cell_id") == cell_id:
            return dict((c.get("cell") or {}).get("options") or [])
    return {}


@dataclass(frozen=True)
class TreeShape:
    """What a row's tree is, as data: its ``kind`` (``sequoia``, ``eagle2``, ``merged``, ``chain``,
    ``branching``, ``width``, or ``unknown`` when a Sequoia row recorded no topology), the option or
    topology that fixed it (``detail``) and, for a merge, how many drafters' trees it merged."""

    kind: str
    detail: str = ""
    drafters: int = 0


def tree_shape(m: dict[str, Any], study: Study, cells: list[str]) -> TreeShape:
    """What the row's tree is: Sequoia's chosen topology, or the options that fixed the shape."""
    if m["method"] == "sequoia":
        trees = Counter(str(t) for t in _extras(study, cells, "sequoia_tree"))
        return TreeShape("sequoia", trees.most_common(1)[0][0]) if trees else TreeShape("unknown")
    if m["method"] in eagle_methods() and is_dynamic_tree(_records(study, cells)):
        return TreeShape("eagle2")
    opts = _options(study, cells[0])
    if m["method"] == "specinfer":
        parts = len(str(m["drafter"] or "").split("+"))
        return TreeShape("merged", str(opts.get("tree_branching", "")), parts)
    if "tree_branching" in opts:
        widths = [int(w) for w in str(opts["tree_branching"]).replace(" ", "").strip("()[]").split(",") if w]
        return (
            TreeShape("chain") if widths and set(widths) == {1} else TreeShape("branching", str(opts["tree_branching"]))
        )
    if "tree_width" in opts:
        return TreeShape("width", str(opts["tree_width"]))
    return TreeShape("chain")


def independent_merge_al(reach: dict[str, list[int]], steps: int) -> float:
    """A merged tree's expected AL if its drafters' hits were independent: with P_i(d) the share of
    steps in which drafter i's own tree matched the accepted path to depth d,
    AL = 1 + Σ_d [1 − Π_i (1 − P_i(d))].  Correlated drafters (they find the same easy tokens) reach
    less than this; one drafter alone gives 1 + Σ_d P_i(d), its AL in those steps."""
    if steps <= 0:
        return math.nan
    depth = max((len(c) for c in reach.values()), default=0)
    miss = [1.0] * depth
    for counts in reach.values():
        for d, hits in enumerate(counts):
            miss[d] *= 1.0 - hits / steps
    return 1.0 + sum(1.0 - m for m in miss)


def _pooled_reach(study: Study, cells: list[str]) -> tuple[dict[str, list[int]], int]:
    """The SpecInfer records' per-drafter reach counts and steps, summed over the row's prompts."""
    total: dict[str, list[int]] = {}
    steps = 0
    for c in cells:
        for r in study.records.get(c, []):
            if r.status != "ok" or "drafter_reach" not in r.extra:
                continue
            steps += int(r.extra.get("drafter_reach_steps", 0))
            for name, counts in dict(r.extra["drafter_reach"]).items():
                acc = total.setdefault(str(name), [])
                acc.extend([0] * (len(counts) - len(acc)))
                for d, v in enumerate(counts):
                    acc[d] += int(v)
    return total, steps


def expected_al(m: dict[str, Any], p: Pooled, study: Study, cells: list[str]) -> tuple[float, str]:
    """(expected AL, where it comes from); NaN where the shape has no model here."""
    if m["method"] == "specinfer":
        recs = [r for c in cells for r in study.records.get(c, []) if r.status == "ok"]
        if any(r.temperature != 0.0 for r in recs):
            return math.nan, "independent drafters: greedy rows only"
        reach, steps = _pooled_reach(study, cells)
        if not steps:
            return math.nan, "—"
        return independent_merge_al(reach, steps), "independent drafters, each at its measured depth"
    if m["method"] == "sequoia":
        vals = [float(v) for v in _extras(study, cells, "sequoia_expected_al")]
        return (sum(vals) / len(vals), "Sequoia DP (calibrated acceptance)") if vals else (math.nan, "—")
    if tree_shape(m, study, cells).kind == "chain" and isnum(p.acceptance.alpha_hat) and m["gamma"]:
        return float(expected_acceptance_length(float(p.acceptance.alpha_hat), int(m["gamma"]))), "chain, i.i.d. α̂"
    return math.nan, "no closed form for this shape"


@dataclass(frozen=True)
class DrafterShare:
    """One drafter of a merged tree: its share of all accepted tokens and the AL its own tree reached
    in the same steps (NaN without reach counts)."""

    drafter: str
    share: float
    own_al: float


def drafter_shares(study: Study, cells: list[str]) -> list[DrafterShare]:
    """Accepted tokens per drafter of a merged tree (SpecInfer), as shares of all accepted, each with
    the AL its own tree reached in the same steps (1 + Σ_d P_i(d), see :func:`independent_merge_al`),
    most accepted first; empty when the records count none."""
    total: Counter[str] = Counter()
    for shares in _extras(study, cells, "drafter_tokens"):
        total.update({str(k): int(v) for k, v in dict(shares).items()})
    n = sum(total.values())
    if not n:
        return []
    reach, steps = _pooled_reach(study, cells)

    def own(name: str) -> float:
        return 1.0 + sum(reach[name]) / steps if steps and name in reach else math.nan

    return [DrafterShare(k, v / n, own(k)) for k, v in total.most_common()]


def _chain_nodes(study: Study, cells: list[str]) -> int:
    """A chain method's verified nodes (it records no tree): its drafted tokens."""
    return sum(r.drafted_tokens or 0 for c in cells for r in study.records.get(c, []) if r.status == "ok")


@dataclass(frozen=True)
class TreeRow:
    """One tree row of the sweep: what ran, its shape, nodes verified per step (NaN without steps),
    its pooled measurement, the AL its shape's model expects and where that comes from, and (a
    merged tree) each drafter's share."""

    label: str
    method: str
    drafter: str
    gamma: int
    dynamic_tree: bool
    shape: TreeShape
    nodes_per_step: float
    pooled: Pooled
    expected_al: float
    expected_from: str
    shares: list[DrafterShare]
    cells: tuple[str, ...] = ()  # the cells it pools (a flagged one marks the row)


def tree_rows(study: Study) -> list[TreeRow]:
    """One row per (label, drafter, γ) of the tree-shape sweep's tree and EAGLE cells."""
    groups: dict[tuple[Any, ...], list[str]] = {}
    for c in study.spec_cell_ids(SWEEP):
        m = study.meta(c)
        if m["method"] in tree_methods() + eagle_methods() or m["family"] == "tree":
            groups.setdefault((m["label"], m["drafter"] or "", m["gamma"] or 0), []).append(c)
    rows = []
    for (label, drafter, gamma), cells in sorted(groups.items()):
        m, p = study.meta(cells[0]), pooled(study, cells)
        nodes = sum(int(v) for v in _extras(study, cells, "tree_nodes")) or _chain_nodes(study, cells)
        steps = sum(r.draft_steps or 0 for c in cells for r in study.records.get(c, []) if r.status == "ok")
        exp, source = expected_al(m, p, study, cells)
        rows.append(
            TreeRow(
                label=label,
                method=m["method"],
                drafter=drafter,
                gamma=gamma,
                dynamic_tree=is_dynamic_tree(r for c in cells for r in study.records.get(c, [])),
                shape=tree_shape(m, study, cells),
                nodes_per_step=nodes / steps if steps else math.nan,
                pooled=p,
                expected_al=exp,
                expected_from=source,
                shares=drafter_shares(study, cells) if m["method"] == "specinfer" else [],
                cells=tuple(cells),
            )
        )
    return rows


def tree_frame(rows: list[TreeRow]) -> pd.DataFrame:
    """The rows' numbers as a frame (the report's raw table beside the worded one)."""
    return pd.DataFrame(
        [
            {
                "label": r.label,
                "method": r.method,
                "drafter": r.drafter,
                "gamma": r.gamma,
                "expected_al": r.expected_al,
                "acceptance_length": r.pooled.acceptance.acceptance_length,
                "speedup": r.pooled.paired.speedup,
                "speedup_ci": r.pooled.paired.speedup_ci,
                "n_prompts": r.pooled.sample.n_prompts,
            }
            for r in rows
        ]
    )
