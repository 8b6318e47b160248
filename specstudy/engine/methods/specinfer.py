"""``specinfer`` — several drafters at once, their candidates merged into one token tree
(SpecInfer, Miao et al. 2024: "collective boost-tuned SSMs" and its token-tree merge).

cell.drafter names the drafters joined by ``+``, e.g. ``self:8+self:15+ngram``; each one is

* a causal LM grown as its own tree (:class:`~specstudy.engine.methods.tree.ModelTreeDrafter`):
  a draft model, ``self[:K]`` (the target's first K layers) or a ``layer_skip_adapter`` file;
* a Medusa-style heads file (``kind: heads``; :class:`~specstudy.engine.methods.heads.HeadsTreeDrafter`);
* ``ngram``: prompt lookup's continuation (:func:`specstudy.engine.methods.ngram.lookup`) as a chain.

Per step every drafter proposes its tree under the pending token (option ``tree_branching``,
the children per node at each depth, for the LM and heads drafters; default a chain of γ); the
trees are merged into one :class:`~specstudy.engine.proposals.ProposalTree` (shared prefixes
become one node) and the target checks every node in ONE forward
(:func:`~specstudy.engine.methods.tree.tree_decode`).  Acceptance is
:func:`~specstudy.engine.proposals.accept_proposals`: the greedy tree walk (lossless), or
multi-step speculative sampling over every drafter's proposals in turn (exact: each proposal is
an independent draw from its drafter's q).  Each record's ``extra["drafter_tokens"]`` counts
the accepted tokens per drafter (the accepted proposal's drafter; greedy: the first drafter
in cell.drafter's order that proposed the node), so the report shows each drafter's share, and
``extra["drafter_reach"]`` how deep each drafter's own tree matched the accepted path per step, from
which the report predicts the merged AL as if the drafters were independent
(:func:`specstudy.analysis.trees.independent_merge_al`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ...drafter_names import LOOKUP, merged_parts
from ..proposals import ProposalTree, ProposalVerdict, accept_proposals, merge_tree, sub_path
from ..tokentree import TokenTree
from ..trace import RowTrace
from . import DecodeJob, EngineMethod, positive_int
from .heads import HeadsTreeDrafter, load_heads
from .ngram import lookup
from .tree import (
    ModelTreeDrafter,
    TreeDrafter,
    check_one_request,
    check_same_vocab,
    load_tree_drafter,
    parse_branching,
    tree_decode,
)

#: what a study is checked against, read as a literal (no import, no torch) by
#: specstudy.frameworks.reference; SPEC below is built from it
HEADER = {
    "name": "specinfer",
    "family": "tree",
    "order": 80,
    "needs_drafter": True,
    "uses_gamma": True,
    "max_batch": 1,
    "options": ("tree_branching", "ngram_min", "ngram_max"),
    "seed_row": "SpecInfer",
    "tree": True,
    "describe": "SpecInfer, the drafters' token trees merged into one tree",
}

NGRAM = LOOKUP
KINDS = ("lm", "heads", NGRAM)


def drafter_kind(name: str) -> str:
    """``lm`` (draft model, ``self[:K]``, layer_skip_adapter file), ``heads`` (heads file) or
    ``ngram``: from the name, and for a .safetensors file from its metadata (no weights read)."""
    if name == NGRAM:
        return NGRAM
    if not name.endswith(".safetensors"):
        return "lm"
    from ..drafters import resolve_drafter_path

    path = resolve_drafter_path(name)
    if not path.exists():
        raise ValueError(f"drafter={name!r}: no such file (train one with `specstudy train-drafter`)")
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        kind = (f.metadata() or {}).get("kind")
    if kind == "heads":
        return "heads"
    if kind == "layer_skip_adapter":
        return "lm"
    raise ValueError(
        f"drafter={name!r} holds drafter kind {kind!r}; specinfer merges LMs (draft models, 'self[:K]', "
        "layer_skip_adapter files), heads files and 'ngram'"
    )


@dataclass
class Drafters:
    """The loaded drafters of one cell, in cell.drafter's order (None for ``ngram``)."""

    names: list[str]
    kinds: list[str]
    modules: list[Any]


def load_drafters(name: str, target: Any, device: str = "cpu", dtype: str = "float32") -> Drafters:
    names = merged_parts(name)
    kinds = [drafter_kind(n) for n in names]
    modules: list[Any] = []
    for n, k in zip(names, kinds):
        if k == NGRAM:
            modules.append(None)
        elif k == "heads":
            modules.append(load_heads(n, target, device, dtype))
        else:
            modules.append(load_tree_drafter(n, target, device, dtype))
    return Drafters(names, kinds, modules)


class NgramTreeDrafter:
    """Prompt lookup as a tree drafter: the continuation found in the context, as one chain of at
    most ``depth`` tokens (γ: the same depth as the other drafters' trees; deterministic: no draft
    distribution, one-hot under sampling)."""

    def __init__(self, ngram_min: int, ngram_max: int, depth: int):
        self.ngram_min, self.ngram_max, self.depth = ngram_min, ngram_max, depth

    def start(self, prompt_hidden: torch.Tensor) -> None:
        pass

    def propose(
        self, committed: Sequence[int], root: int, max_depth: int, generator: torch.Generator | None
    ) -> TokenTree:
        tree = TokenTree(tokens=[int(root)], parents=[-1])
        for t in lookup(list(committed) + [int(root)], min(max_depth, self.depth), self.ngram_min, self.ngram_max):
            tree.add(len(tree) - 1, t)
        return tree

    def accept(self, path: Sequence[int], hidden: torch.Tensor) -> None:
        pass


class MergedTreeDrafter:
    """Every drafter's tree merged into one; each drafter learns its own part of the accepted
    path; :meth:`verify` credits each accepted token to a drafter."""

    def __init__(self, drafters: Sequence[TreeDrafter], names: Sequence[str]):
        self.drafters, self.names = list(drafters), list(names)
        self.credit = [0] * len(self.drafters)
        self.reach: list[list[int]] = [[] for _ in self.drafters]
        self.steps = 0
        self._subs: list[TokenTree] = []
        self._tree: ProposalTree | None = None

    def start(self, prompt_hidden: torch.Tensor) -> None:
        for d in self.drafters:
            d.start(prompt_hidden)

    def propose(
        self, committed: Sequence[int], root: int, max_depth: int, generator: torch.Generator | None
    ) -> ProposalTree:
        tree = ProposalTree(tokens=[int(root)], parents=[-1])
        self._subs = [d.propose(committed, root, max_depth, generator) for d in self.drafters]
        for i, sub in enumerate(self._subs):
            merge_tree(tree, sub, i)
        self._tree = tree
        return tree

    def verify(
        self, tree: TokenTree, logits: torch.Tensor, sampling: Any, gen: torch.Generator | None
    ) -> ProposalVerdict:
        assert isinstance(tree, ProposalTree)
        verdict = accept_proposals(tree, logits, sampling, gen)
        for s in verdict.credit:
            self.credit[s] += 1
        return verdict

    def accept(self, path: Sequence[int], hidden: torch.Tensor) -> None:
        assert self._tree is not None
        tokens = [self._tree.tokens[n] for n in path[1:]]
        self.steps += 1
        for i, (d, sub) in enumerate(zip(self.drafters, self._subs)):
            own = sub_path(sub, tokens)
            self._count_reach(i, len(own) - 1)
            d.accept(own, hidden)

    def _count_reach(self, i: int, depth: int) -> None:
        """Drafter i's own tree matched the accepted path to ``depth``: one more step reaching 1..depth."""
        counts = self.reach[i]
        counts.extend([0] * (depth - len(counts)))
        for k in range(depth):
            counts[k] += 1

    def shares(self) -> dict[str, int]:
        """Accepted tokens per drafter name."""
        return dict(zip(self.names, self.credit))

    def reach_counts(self) -> dict[str, list[int]]:
        """Per drafter, the steps in which its own tree matched the accepted path to depth 1, 2, ...
        Under greedy that is how far the target would have accepted that drafter's tree alone at
        those steps (the accepted path is the target's own greedy continuation, as far as any tree
        reached); the report's independent-drafters prediction reads it."""
        return {n: list(c) for n, c in zip(self.names, self.reach)}


def _branching(job: DecodeJob) -> tuple[int, ...]:
    b = job.option("tree_branching")
    return tuple(b) if b is not None else (1,) * job.draft_length


def build_drafter(job: DecodeJob, drafters: Drafters) -> MergedTreeDrafter:
    shape = _branching(job)
    parts: list[TreeDrafter] = []
    for kind, module in zip(drafters.kinds, drafters.modules):
        if kind == NGRAM:
            parts.append(NgramTreeDrafter(job.option("ngram_min", 1), job.option("ngram_max", 3), len(shape)))
        elif kind == "heads":
            heads = module.to(device=job.device, dtype=next(job.target.parameters()).dtype)
            parts.append(HeadsTreeDrafter(heads, job.target, shape[: heads.num_heads], job.sampling))
        else:
            check_same_vocab(module, job.target)
            parts.append(ModelTreeDrafter(module, shape, job.sampling))
    return MergedTreeDrafter(parts, drafters.names)


def decode(job: DecodeJob) -> list[RowTrace]:
    check_one_request(job, "specinfer")
    drafters = job.drafter
    if not isinstance(drafters, Drafters):
        raise ValueError(f"method 'specinfer' needs its drafters loaded by its load_drafter, got {type(drafters)}")
    merged = build_drafter(job, drafters)
    row = tree_decode(
        job.target,
        job.prompts[0],
        job.sampling,
        merged,
        job.generator(),
        job.eos_token_ids,
        job.device,
        verify=merged.verify,
    )
    row.notes["drafters"] = list(drafters.names)
    row.notes["drafter_tokens"] = merged.shares()
    row.notes["drafter_reach"] = merged.reach_counts()
    row.notes["drafter_reach_steps"] = merged.steps
    return [row]


def _check_part(name: str, gamma: int | None, branching: tuple[int, ...] | None) -> None:
    from .tree import _check_drafter_name

    kind = drafter_kind(name)
    if kind == "lm" and not name.endswith(".safetensors"):
        _check_drafter_name(name)
    if kind == "heads":
        from ..drafters import drafter_file_metadata

        n_heads = int(drafter_file_metadata(name, "heads").get("num_heads", 0) or 0)
        if n_heads and gamma is not None and gamma > n_heads:
            raise ValueError(f"drafter {name!r} has {n_heads} heads: gamma={gamma} must be <= {n_heads}")


@dataclass(frozen=True)
class SpecInferSpec(EngineMethod):
    """Checks every drafter name and the tree shape against γ before any model is loaded."""

    def check(self, gamma: int | None, batch_size: int, drafter: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        out = EngineMethod.check(self, gamma, batch_size, drafter, options)
        branching = out.get("tree_branching")
        if branching is not None and len(branching) != gamma:
            raise ValueError(
                f"method 'specinfer': tree_branching={','.join(map(str, branching))} has depth "
                f"{len(branching)}, but gamma={gamma}: the tree depth is gamma"
            )
        if out.get("ngram_min", 1) > out.get("ngram_max", 3):
            raise ValueError(f"method 'specinfer': ngram_min={out['ngram_min']} > ngram_max={out.get('ngram_max', 3)}")
        if isinstance(drafter, str):
            problems = []
            for part in merged_parts(drafter):
                try:
                    _check_part(part, gamma, branching)
                except ValueError as e:
                    problems.append(str(e))
            if problems:
                raise ValueError("method 'specinfer': " + "; ".join(problems))
        return out


SPEC = SpecInferSpec.from_header(
    HEADER,
    decode=decode,
    load_drafter=load_drafters,
    options={"tree_branching": parse_branching, "ngram_min": positive_int, "ngram_max": positive_int},
    description="SpecInfer-style merged token tree: several drafters joined by '+' (draft models, "
    "'self[:K]', layer_skip_adapter or heads files, 'ngram'), one target pass",
)
