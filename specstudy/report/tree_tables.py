"""The tree-shape sweep as the report prints it: each row's shape, drafters and per-drafter shares
in words, beside its measured and expected AL.  The rows and their numbers come from
:func:`specstudy.analysis.trees.tree_rows`; only their wording is made here."""

from __future__ import annotations

import pandas as pd

from ..analysis.study_records import Study
from ..analysis.trees import DrafterShare, TreeRow, TreeShape, tree_frame, tree_rows
from .format import fmt, fmt_ci, seed_row_name, short_model
from .tables import flag_mark

EAGLE2_SHAPE = "EAGLE-2 dynamic: the drafter's top-k of the most confident nodes per level, reranked within the budget"


def shape_text(shape: TreeShape) -> str:
    """A tree's shape in words: Sequoia's topology as recorded, or the options that fixed it."""
    if shape.kind == "sequoia":
        return shape.detail
    if shape.kind == "eagle2":
        return EAGLE2_SHAPE
    if shape.kind == "merged":
        return f"{shape.drafters} drafters' trees merged (each {shape.detail or 'a chain of γ'})"
    if shape.kind == "branching":
        return f"branching {shape.detail}"
    if shape.kind == "width":
        return f"width {shape.detail} per depth"
    if shape.kind == "chain":
        return "chain"
    return "—"


def shares_text(shares: list[DrafterShare]) -> str:
    """``drafter 60% (own AL 1.80), …``: a merged tree's accepted tokens per drafter."""
    if not shares:
        return "—"

    def own(s: DrafterShare) -> str:
        return f" (own AL {fmt(s.own_al)})" if s.own_al == s.own_al else ""

    return ", ".join(f"{short_model(s.drafter)} {s.share:.0%}{own(s)}" for s in shares)


def tree_row_cells(r: TreeRow, mark: str = "") -> dict[str, object]:
    """One row of the printed table (``mark``: the flag mark where the row pools a flagged cell)."""
    p = r.pooled
    return {
        "Seed row": seed_row_name(r.method, r.dynamic_tree),
        "Method (what ran)": r.label + mark,
        "Drafter(s)": " + ".join(short_model(d) for d in str(r.drafter).split("+")) if r.drafter else "—",
        "Shape": shape_text(r.shape),
        "Depth (γ)": r.gamma,
        "Nodes verified / step (mean)": fmt(r.nodes_per_step, 1),
        "AL measured": fmt_ci(p.acceptance.acceptance_length, p.acceptance.acceptance_length_ci, n=p.sample.n_prompts),
        "AL expected (prediction)": fmt(r.expected_al),
        "Expected from": r.expected_from,
        "Speedup": fmt_ci(p.paired.speedup, p.paired.speedup_ci, 2, "×", n=p.sample.n_prompts),
        "Accepted per drafter": shares_text(r.shares) if r.method == "specinfer" else "—",
        "n (prompts)": p.sample.n_prompts,
    }


def tree_shape_table(study: Study) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per tree row of the sweep: its shape, node budget, measured AL and speedup, expected AL."""
    rows = tree_rows(study)
    return pd.DataFrame([tree_row_cells(r, flag_mark(study, r.cells)) for r in rows]), tree_frame(rows)
