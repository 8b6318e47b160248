"""A token tree whose siblings remember who drafted them and from which distribution.

SpecInfer (Miao et al. 2024) merges the candidates of several drafters into one token tree;
Sequoia (Chen et al. 2024) draws a node's children without replacement.  Both need more than
:class:`~specstudy.engine.tokentree.TokenTree`'s one draft distribution per parent: each
*proposal* of a child carries the distribution it was drawn from and the drafter that drew it.
Shared prefixes are merged into one node (one row of the target's tree forward), but a token
proposed twice (two drafters, or two i.i.d. draws) stays two proposals.

Verification (:func:`accept_proposals`), with p the target's distribution after the node:

* greedy — the tree walk of :func:`specstudy.engine.methods.tree.accept_greedy` (lossless);
* sampling — multi-step speculative sampling over the node's proposals in order: proposal j of
  token x drawn from q_j is accepted iff u · q_j(x) < p(x); on rejection p ← norm(max(p − q_j, 0))
  (:func:`specstudy.engine.methods.tree.sibling_step`).  When every proposal is rejected the next
  token is drawn from the last p.  Each test is an exact rejection step with proposal q_j against
  the current p, so the emitted token follows the target whenever proposal j's token is a draw
  from q_j given everything tested before it: drafters drawing independently (SpecInfer), or
  q_j = q with the earlier draws removed and renormalised (sampling without replacement, Sequoia).
  ``q_j = None`` is a deterministic proposal (n-gram lookup, greedy heads): one-hot on x.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .methods.tree import TreeVerdict, accept_greedy, sample_token, sibling_step
from .sampling import probs_for
from .tokentree import TokenTree


@dataclass
class Proposal:
    """One draw of a child: the node it landed on, its draft distribution, its drafter."""

    child: int
    q: torch.Tensor | None  # None: deterministic (one-hot on the child's token)
    source: int  # index of the drafter that proposed it


@dataclass
class ProposalTree(TokenTree):
    """A token tree with each node's proposals in testing order (``proposals[parent]``)."""

    proposals: dict[int, list[Proposal]] = field(default_factory=dict)

    def propose(self, parent: int, token: int, q: torch.Tensor | None, source: int) -> int:
        """Add a proposal of ``token`` under ``parent``: a new node, or the sibling already
        carrying that token (shared prefixes merged).  Returns the node."""
        node = next((c for c in self.children(parent) if self.tokens[c] == int(token)), None)
        if node is None:
            node = self.add(parent, token)
        self.proposals.setdefault(parent, []).append(Proposal(node, q, source))
        return node

    def sources(self, node: int) -> list[int]:
        """The drafters that proposed ``node`` (in proposal order, repeats removed)."""
        parent = self.parents[node]
        seen: list[int] = []
        for p in self.proposals.get(parent, []):
            if p.child == node and p.source not in seen:
                seen.append(p.source)
        return seen


@dataclass
class ProposalVerdict(TreeVerdict):
    """A :class:`TreeVerdict` that also says, per accepted node, the drafter credited with it
    (the accepted proposal's drafter; greedy: the node's first proposer)."""

    credit: list[int] = field(default_factory=list)


def merge_tree(tree: ProposalTree, sub: TokenTree, source: int, map_root: int = 0) -> dict[int, int]:
    """Merge drafter ``source``'s own tree ``sub`` into ``tree`` (its root on ``map_root``):
    every child of a ``sub`` node becomes a proposal drawn from ``sub.child_q`` of its parent
    (None when ``sub`` has none: deterministic).  Returns sub node → merged node."""
    where = {0: map_root}
    for i in range(1, len(sub)):
        parent = sub.parents[i]
        where[i] = tree.propose(where[parent], sub.tokens[i], sub.child_q.get(parent), source)
    return where


def sub_path(sub: TokenTree, tokens: Sequence[int]) -> list[int]:
    """The longest root path of ``sub`` whose tokens after the root are ``tokens``' prefix."""
    path = [0]
    for t in tokens:
        nxt = next((c for c in sub.children(path[-1]) if sub.tokens[c] == t), None)
        if nxt is None:
            break
        path.append(nxt)
    return path


def _one_hot(token: int, like: torch.Tensor) -> torch.Tensor:
    q = torch.zeros_like(like)
    q[token] = 1.0
    return q


def accept_proposals(
    tree: ProposalTree, target_logits: torch.Tensor, sampling: Any, generator: torch.Generator | None
) -> ProposalVerdict:
    """The accepted path, the next token and each accepted node's drafter (module docstring)."""
    if sampling.greedy:
        v = accept_greedy(tree, target_logits)
        return ProposalVerdict(v.path, v.next_token, [tree.sources(n)[0] for n in v.path[1:]])
    probs = probs_for(target_logits, sampling)
    node, path, credit = 0, [0], []
    while True:
        p = probs[node]
        moved = False
        for prop in tree.proposals.get(node, []):
            token = tree.tokens[prop.child]
            q = _one_hot(token, p) if prop.q is None else prop.q
            ok, p_res = sibling_step(p, q, token, generator)
            if ok:
                node, moved = prop.child, True
                path.append(node)
                credit.append(prop.source)
                break
            p = p_res
        if not moved:
            return ProposalVerdict(path, sample_token(p, generator), credit)
