"""Sequoia's tree (Chen et al. 2024): the topology that maximises expected accepted tokens.

Positional acceptance: the child of rank k (the drafter's k-th most likely token, or its k-th
draw without replacement) is the accepted one with probability ``a[k-1]`` wherever it sits, so
a node on ranks k_1..k_d from the root is reached with probability ∏ a[k_j - 1] and a tree's
expected tokens per step (accepted drafts + the next token) is the sum of that over its nodes,
root included (:func:`expected_tokens`).  The dynamic program (:func:`best_trees`) finds, per
node count n and depth bound d, the tree that maximises it:

    F_d(n) = 1 + H_d(1, n − 1);   H_d(k, 0) = 0;   H_d(k, m) = max_{1 ≤ j ≤ m} a_k F_{d−1}(j) + H_d(k + 1, m − j)

(children on contiguous ranks 1, 2, ..., each rank's subtree of j nodes and depth ≤ d − 1).
At a fixed budget (:func:`budget_tree`) the tree is F's argmax at n alone.  Hardware-aware
choice (:func:`choose_tree`): per (n, d), predicted speedup over the target
alone = F / (T(n)/T(1) + d · c), with T(n)/T(1) the measured cost of verifying n tree nodes in
one forward and c one drafter forward over one target forward (a drafter forward per level).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

NEG = -math.inf


@dataclass(frozen=True)
class Topology:
    """A tree shape in breadth-first order: ``parents[i]`` (node 0 the root, parent -1)."""

    parents: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.parents)

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    @property
    def depth(self) -> int:
        d = [0] * self.size
        for i, p in enumerate(self.parents[1:], start=1):
            d[i] = d[p] + 1
        return max(d)

    def describe(self) -> str:
        """Nested brackets, children in rank order: a root with a 2-chain and a leaf is ``[[[]][]]``."""

        def one(node: int) -> str:
            return "[" + "".join(one(c) for c in self.children(node)) + "]"

        return one(0)


def _from_nested(nested: tuple[Any, ...]) -> Topology:
    """Children-tuples (rank order) → breadth-first :class:`Topology`."""
    parents, queue = [-1], [(0, nested)]
    while queue:
        nxt = []
        for node, kids in queue:
            for k in kids:
                parents.append(node)
                nxt.append((len(parents) - 1, k))
        queue = nxt
    return Topology(tuple(parents))


def expected_tokens(topology: Topology, acceptance: Sequence[float]) -> float:
    """Σ over nodes of P(node reached) under positional acceptance (root included)."""
    reach = [1.0] * topology.size
    for node in range(topology.size):
        for rank, c in enumerate(topology.children(node)):
            reach[c] = reach[node] * (acceptance[rank] if rank < len(acceptance) else 0.0)
    return sum(reach)


def best_trees(
    acceptance: Sequence[float], max_nodes: int, max_depth: int
) -> dict[tuple[int, int], tuple[float, Topology]]:
    """``{(n, d): (expected tokens, topology)}``: the best tree of at most n nodes (root
    included) and depth at most d, for 1 ≤ n ≤ max_nodes, 0 ≤ d ≤ max_depth."""
    a = [float(x) for x in acceptance]
    if max_nodes < 1 or max_depth < 0 or any(not 0.0 <= x <= 1.0 for x in a):
        raise ValueError(
            f"max_nodes={max_nodes}, max_depth={max_depth}, acceptance={a}: need n >= 1, d >= 0, a in [0, 1]"
        )
    k_max = len(a)
    f: list[list[float]] = [[NEG] * (max_nodes + 1) for _ in range(max_depth + 1)]  # exact n
    kids: list[list[tuple[Any, ...]]] = [[()] * (max_nodes + 1) for _ in range(max_depth + 1)]
    for d in range(max_depth + 1):
        f[d][1] = 1.0
    for d in range(1, max_depth + 1):
        # h[k][m]: ranks k.. (0-based) share m nodes; choice[k][m] = nodes of rank k's subtree
        h = [[NEG] * (max_nodes) for _ in range(k_max + 1)]
        choice = [[0] * (max_nodes) for _ in range(k_max + 1)]
        for k in range(k_max, -1, -1):
            h[k][0] = 0.0
            if k == k_max:
                continue
            for m in range(1, max_nodes):
                for j in range(1, m + 1):
                    if f[d - 1][j] == NEG or h[k + 1][m - j] == NEG:
                        continue
                    v = a[k] * f[d - 1][j] + h[k + 1][m - j]
                    if v > h[k][m]:
                        h[k][m], choice[k][m] = v, j
        for n in range(2, max_nodes + 1):
            if h[0][n - 1] == NEG:
                continue
            f[d][n] = 1.0 + h[0][n - 1]
            out, k, m = [], 0, n - 1
            while m > 0:
                j = choice[k][m]
                out.append(kids[d - 1][j])
                k, m = k + 1, m - j
            kids[d][n] = tuple(out)
    best: dict[tuple[int, int], tuple[float, Topology]] = {}
    for d in range(max_depth + 1):
        top_v, top_n = NEG, 1
        for n in range(1, max_nodes + 1):
            if f[d][n] > top_v + 1e-12:
                top_v, top_n = f[d][n], n
            best[(n, d)] = (top_v, _from_nested(kids[d][top_n]))
    return best


def cost_at(curve: Mapping[int, float], n: int) -> float:
    """T(n)/T(1) from measured points (linear between them, the last slope beyond)."""
    ks = sorted(curve)
    if not ks:
        raise ValueError("the cost curve has no points")
    if n in curve:
        return float(curve[n])
    i = bisect.bisect_left(ks, n)
    if i == 0:
        return float(curve[ks[0]])
    lo, hi = (ks[i - 1], ks[i]) if i < len(ks) else (ks[-2], ks[-1]) if len(ks) > 1 else (ks[-1], ks[-1])
    if hi == lo:
        return float(curve[lo])
    return float(curve[lo]) + (n - lo) * (float(curve[hi]) - float(curve[lo])) / (hi - lo)


@dataclass(frozen=True)
class SequoiaChoice:
    """The chosen tree and why: its predicted tokens per step and speedup (predictions)."""

    topology: Topology
    expected_tokens: float  # predicted AL (accepted drafts + 1 per step)
    predicted_speedup: float
    nodes: int  # tree nodes, root included (the verified forward's width)
    depth: int


def _scored(value: float, topo: Topology, cost_curve: Mapping[int, float], draft_cost: float) -> SequoiaChoice:
    """A tree with its predicted speedup F / (T(n)/T(1) + d · c)."""
    speed = value / (cost_at(cost_curve, topo.size) + topo.depth * draft_cost)
    return SequoiaChoice(topo, value, speed, topo.size, topo.depth)


def choose_tree(
    acceptance: Sequence[float],
    cost_curve: Mapping[int, float],
    max_nodes: int,
    max_depth: int,
    draft_cost: float = 0.0,
) -> SequoiaChoice:
    """The (n, d) tree with the highest predicted speedup F / (T(n)/T(1) + d · c)."""
    scored = [_scored(v, t, cost_curve, draft_cost) for v, t in best_trees(acceptance, max_nodes, max_depth).values()]
    pick = scored[0]
    for choice in scored[1:]:
        if choice.predicted_speedup > pick.predicted_speedup + 1e-12:
            pick = choice
    return pick


def budget_tree(
    acceptance: Sequence[float],
    cost_curve: Mapping[int, float],
    max_nodes: int,
    max_depth: int,
    draft_cost: float = 0.0,
) -> SequoiaChoice:
    """The tree of at most ``max_nodes`` nodes and depth ``max_depth`` with the most expected tokens
    (Sequoia's DP without the hardware-aware choice of n: a matched node budget), with its predicted
    speedup on this cost curve beside it."""
    value, topo = best_trees(acceptance, max_nodes, max_depth)[(max_nodes, max_depth)]
    return _scored(value, topo, cost_curve, draft_cost)
