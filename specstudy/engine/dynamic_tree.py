"""EAGLE-2's context-aware dynamic draft tree (Li et al. 2024): grow by confidence, then rerank.

A node's *confidence* is the product of the drafter's probabilities along its path from the
root (kept as a sum of logs, ``score``).  Per step, with top-k ``k``, depth γ and a budget of N
verified nodes:

1. expand (:func:`grow`): the root's k most likely tokens are depth 1; at every later depth the
   k nodes of the newest level with the highest confidence are fed to the drafter (one forward
   for the level) and each gets its k most likely tokens as children;
2. rerank (:func:`rerank`): of every drafted node, the N most confident are verified.  A node is
   never more confident than its parent and ties go to the earlier (shallower) node, so the kept
   set is closed under parents: a tree;
3. the kept nodes become a :class:`~specstudy.engine.proposals.ProposalTree` whose children are
   *deterministic* proposals (:func:`verified_tree`): they are a function of the context, not
   draws, so under sampling each sibling test accepts token x with probability p(x) and the
   residual drops x (one-hot q in :func:`~specstudy.engine.proposals.accept_proposals`): exact
   rejection steps, the output distributed exactly as the target's.  Greedy: the tree walk.

The drafter is any callable that returns the next-token distributions of a list of nodes
(:data:`Expand`); :class:`~specstudy.engine.methods.eagle.EagleTreeDrafter` feeds the EAGLE
heads' features with a tree mask.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .proposals import ProposalTree


@dataclass
class DraftNode:
    """One drafted token: its parent (index into the node list; -1 for the root), depth and
    cumulative log confidence."""

    token: int
    parent: int
    depth: int
    score: float


#: the drafter: node indices of the newest level (all fed in one forward) → their distributions [m, V]
Expand = Callable[[list[DraftNode], list[int]], torch.Tensor]


def top_children(q: torch.Tensor, k: int) -> list[tuple[int, float]]:
    """The k most likely tokens of distribution ``q`` with their log probabilities (zero-mass
    tokens left out: a draft vocabulary smaller than k)."""
    vals, idx = torch.topk(q, min(k, q.shape[-1]))
    return [(int(t), float(torch.log(v))) for t, v in zip(idx, vals) if float(v) > 0]


def grow(root: int, root_q: torch.Tensor, expand: Expand, depth: int, k: int) -> list[DraftNode]:
    """Step 1: node 0 is the root; returns every drafted node (creation order: by depth)."""
    nodes = [DraftNode(int(root), -1, 0, 0.0)]
    level = [_add(nodes, 0, t, lp) for t, lp in top_children(root_q, k)] if depth >= 1 else []
    for _ in range(1, depth):
        frontier = sorted(level, key=lambda i: (-nodes[i].score, i))[:k]
        if not frontier:
            break
        dists = expand(nodes, frontier)
        level = [_add(nodes, f, t, lp) for f, q in zip(frontier, dists) for t, lp in top_children(q, k)]
    return nodes


def _add(nodes: list[DraftNode], parent: int, token: int, logp: float) -> int:
    p = nodes[parent]
    nodes.append(DraftNode(token, parent, p.depth + 1, p.score + logp))
    return len(nodes) - 1


def rerank(nodes: Sequence[DraftNode], budget: int) -> list[int]:
    """Step 2: the ``budget`` most confident drafted nodes (root excluded), closed under parents."""
    ranked = sorted(range(1, len(nodes)), key=lambda i: (-nodes[i].score, i))[:budget]
    kept = set(ranked)
    if any(nodes[i].parent != 0 and nodes[i].parent not in kept for i in ranked):
        raise AssertionError("rerank kept a node without its parent: confidences must not grow along a path")
    return ranked


def verified_tree(nodes: Sequence[DraftNode], kept: Sequence[int]) -> ProposalTree:
    """Step 3: the kept nodes in breadth-first order, each parent's children most confident
    first, every child a deterministic proposal."""
    tree = ProposalTree(tokens=[nodes[0].token], parents=[-1])
    where = {0: 0}
    for i in sorted(kept, key=lambda i: (nodes[i].depth, -nodes[i].score, i)):
        where[i] = tree.propose(where[nodes[i].parent], nodes[i].token, None, 0)
    return tree
