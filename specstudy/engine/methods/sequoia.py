"""``sequoia`` — a token tree whose shape is chosen by Sequoia's dynamic program (Chen et al. 2024).

The drafter (as for ``tree``: a draft model, ``self[:K]`` or a ``layer_skip_adapter`` file)
grows the tree of the chosen topology: a node with c children gets the drafter's c most likely
tokens (greedy) or c draws *without replacement* from its q (sampling), tested in that order
(:func:`~specstudy.engine.proposals.accept_proposals`; the j-th draw's distribution is q with
the earlier draws removed, which keeps the output exactly the target's).  The topology is the
one of at most ``tree_nodes`` drafted nodes and depth at most γ with the highest predicted
speedup (:func:`specstudy.engine.sequoia_dp.choose_tree`; with ``sequoia_choose: tokens`` the one
of the most expected tokens at that budget, :func:`~specstudy.engine.sequoia_dp.budget_tree`, for
a comparison of shapes at a matched node budget) from

* the acceptance vector (option ``sequoia_acceptance: "0.55,0.12,0.05"``, e.g. from a finished
  study; else measured on the cell's first prompt, :mod:`specstudy.engine.sequoia_calibration`),
* the verification-cost curve T(n)/T(1) (option ``sequoia_cost: "1:1,2:1.02,8:1.1"``; else
  measured on this machine) and the drafter's cost c (``sequoia_draft_cost``; else measured).

The calibration runs once per drafter, sampling and budget in the process and is reused by
later requests.  Every record's ``extra`` carries the tree (``sequoia_tree``, nested brackets),
its node count and depth, the DP's ``sequoia_expected_al`` (a prediction: accepted drafts + 1
per step) and the inputs it came from, so the report prints the prediction beside the measured AL.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..proposals import ProposalTree, accept_proposals
from ..sampling import make_generator
from ..sequoia_calibration import acceptance_vector, cost_curve, draft_cost, draws_without_replacement
from ..sequoia_dp import SequoiaChoice, Topology, budget_tree, choose_tree
from ..trace import RowTrace
from . import DecodeJob, non_negative_float, positive_int
from .tree import (
    ModelTreeDrafter,
    TreeSpec,
    check_one_request,
    check_same_vocab,
    lm_forward,
    load_tree_drafter,
    tree_decode,
)

#: what a study is checked against, read as a literal (no import, no torch) by
#: specstudy.frameworks.reference; SPEC below is built from it
HEADER = {
    "name": "sequoia",
    "family": "tree",
    "order": 90,
    "needs_drafter": True,
    "uses_gamma": True,
    "max_batch": 1,
    "options": ("tree_nodes", "sequoia_acceptance", "sequoia_cost", "sequoia_draft_cost", "sequoia_choose"),
    "seed_row": "Sequoia",
    "tree": True,
    "describe": "a Sequoia DP token tree of at most {tree_nodes} nodes, depth <= {gamma}",
}


class TopologyTreeDrafter(ModelTreeDrafter):
    """A :class:`ModelTreeDrafter` that grows a fixed topology, one drafter forward per level."""

    def __init__(self, model: Any, topology: Topology, sampling: Any):
        super().__init__(model, (1,), sampling)
        self.topology = topology

    def _children(self, q: torch.Tensor, c: int, generator: torch.Generator | None) -> list[tuple[int, Any]]:
        if self.sampling.greedy:
            return [(t, None) for t in torch.topk(q, min(c, q.shape[-1])).indices.tolist()]
        return draws_without_replacement(q, c, generator)

    @torch.no_grad()
    def propose(
        self, committed: Sequence[int], root: int, max_depth: int, generator: torch.Generator | None
    ) -> ProposalTree:
        logits = lm_forward(self.model, self.cache, self.cached, list(committed[self.cached :]) + [int(root)])
        past, depth = len(committed), min(self.topology.depth, max_depth)
        tree = ProposalTree(tokens=[int(root)], parents=[-1])
        dist, where, frontier, fed = {0: self._q(logits[-1])}, {0: 0}, [0], 1
        for d in range(depth):
            new_topo, new_nodes = [], []
            for f in frontier:
                kids = self.topology.children(f)
                for k, (tok, q) in zip(kids, self._children(dist[where[f]], len(kids), generator)):
                    where[k] = tree.propose(where[f], tok, q, 0)
                    new_topo.append(k)
                    new_nodes.append(where[k])
            if not new_nodes:
                break
            if d + 1 < depth and any(self.topology.children(k) for k in new_topo):
                lg = lm_forward(self.model, self.cache, past, tree.tokens, tree.parents, rows=new_nodes)
                dist.update({n: self._q(lg[i]) for i, n in enumerate(new_nodes)})
                fed = new_nodes[-1] + 1
            frontier = new_topo
        self._past, self._fed = past, fed
        return tree


@dataclass
class SequoiaDrafter:
    """The drafter LM of a cell and the trees chosen for it, per (sampling, budget, depth)."""

    name: str
    model: Any
    choices: dict[tuple[Any, ...], tuple[SequoiaChoice, dict[str, Any]]] = field(default_factory=dict)


def load_sequoia_drafter(name: str, target: Any, device: str = "cpu", dtype: str = "float32") -> SequoiaDrafter:
    return SequoiaDrafter(name, load_tree_drafter(name, target, device, dtype))


def _calibrate(job: DecodeJob, drafter: SequoiaDrafter) -> tuple[SequoiaChoice, dict[str, Any]]:
    s = job.sampling
    budget, depth = int(job.option("tree_nodes", 4)), job.draft_length
    key = (s.temperature, s.top_k, s.top_p, budget, depth, str(job.device), job.option("sequoia_choose", "speedup"))
    if key in drafter.choices:
        return drafter.choices[key]
    prompt = list(job.prompts[0])
    acc = job.option("sequoia_acceptance")
    if acc is None:
        gen = make_generator(s.seed, "cpu")
        acc = acceptance_vector(job.target, drafter.model, prompt, budget, s, gen)
    curve = job.option("sequoia_cost") or cost_curve(job.target, prompt, budget + 1, job.device)
    c = job.option("sequoia_draft_cost")
    if c is None:
        c = draft_cost(drafter.model, job.target, prompt, job.device)
    pick = budget_tree if job.option("sequoia_choose", "speedup") == "tokens" else choose_tree
    choice = pick(acc, curve, budget + 1, depth, float(c))
    source = "given" if job.option("sequoia_acceptance") is not None else f"measured on a {len(prompt)}-token prompt"
    notes = {
        "sequoia_tree": choice.topology.describe(),
        "sequoia_nodes": choice.nodes - 1,
        "sequoia_depth": choice.depth,
        "sequoia_expected_al": round(choice.expected_tokens, 4),
        "sequoia_predicted_speedup": round(choice.predicted_speedup, 4),
        "sequoia_acceptance": [round(x, 4) for x in acc],
        "sequoia_acceptance_source": source,
        "sequoia_cost": {int(n): round(float(v), 4) for n, v in curve.items()},
        "sequoia_draft_cost": round(float(c), 4),
        "sequoia_budget": budget,
        "sequoia_choose": job.option("sequoia_choose", "speedup"),
    }
    drafter.choices[key] = (choice, notes)
    return choice, notes


def decode(job: DecodeJob) -> list[RowTrace]:
    check_one_request(job, "sequoia")
    d = job.drafter
    if not isinstance(d, SequoiaDrafter):
        raise ValueError(f"method 'sequoia' needs its drafter loaded by its load_drafter, got {type(d).__name__}")
    check_same_vocab(d.model, job.target)
    choice, notes = _calibrate(job, d)
    if choice.nodes <= 1:  # the DP found no tree that pays on this hardware: decode as AR, drafting nothing
        from . import get_method

        row = get_method("ar").decode(dataclasses.replace(job, drafter=None, gamma=None))[0]
        row.tree_nodes = 0
        row.notes.update(notes)
        return [row]
    grower = TopologyTreeDrafter(d.model, choice.topology, job.sampling)
    row = tree_decode(
        job.target,
        job.prompts[0],
        job.sampling,
        grower,
        job.generator(),
        job.eos_token_ids,
        job.device,
        verify=lambda tree, logits, s, g: accept_proposals(tree, logits, s, g),  # type: ignore[arg-type]
    )
    row.notes.update(notes)
    return [row]


def _acceptance(v: Any) -> list[float]:
    vals = [float(x) for x in (v.split(",") if isinstance(v, str) else v)]
    if not vals or any(not 0.0 <= x <= 1.0 for x in vals) or sum(vals) > 1.0 + 1e-9:
        raise ValueError("need comma-separated shares in [0, 1] summing to at most 1, e.g. '0.55,0.12,0.05'")
    return vals


CHOOSE = ("speedup", "tokens")


def _choose(v: Any) -> str:
    if v not in CHOOSE:
        raise ValueError(
            f"need one of {list(CHOOSE)}: 'speedup' picks the node count from the cost curve (at most "
            "tree_nodes), 'tokens' fills the budget with the tree of most expected tokens"
        )
    return str(v)


def _cost(v: Any) -> dict[int, float]:
    items = v.items() if isinstance(v, dict) else (p.split(":") for p in str(v).split(","))
    try:
        curve = {int(n): float(t) for n, t in items}
    except ValueError:
        raise ValueError("need 'n:T(n)/T(1)' pairs, e.g. '1:1,2:1.02,8:1.1'") from None
    if 1 not in curve or any(n < 1 or t <= 0 for n, t in curve.items()):
        raise ValueError("need positive 'n:T(n)/T(1)' pairs including n = 1, e.g. '1:1,2:1.02,8:1.1'")
    return curve


@dataclass(frozen=True)
class SequoiaSpec(TreeSpec):
    """The tree method's drafter check; the budget and calibration inputs checked as options."""


SPEC = SequoiaSpec.from_header(
    HEADER,
    decode=decode,
    load_drafter=load_sequoia_drafter,
    options={
        "tree_nodes": positive_int,
        "sequoia_acceptance": _acceptance,
        "sequoia_cost": _cost,
        "sequoia_draft_cost": non_negative_float,
        "sequoia_choose": _choose,
    },
    description="Sequoia-style tree: the DP's topology of at most tree_nodes drafted nodes and depth <= gamma, "
    "chosen from the measured acceptance vector and verification-cost curve; drafter as for 'tree'",
)
