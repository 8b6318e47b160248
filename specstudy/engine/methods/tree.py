"""``tree`` — multi-draft token-tree verification (SpecInfer / Sequoia style).

Several candidate continuations share their prefixes in a token tree; the target checks the
whole tree in ONE forward.  Per step (batch 1, :func:`tree_decode`):

1. the drafter grows a tree under the *root*, the pending token (sampled last step, not yet in
   the target's cache): node 0; nodes in breadth-first order, so ``parents[i] < i`` and each
   depth is one contiguous block (:class:`~specstudy.engine.tokentree.TokenTree`);
2. the target runs once over every node: node i sits at position ``past + depth(i)`` and
   attends to the committed prefix (the KV cache) and to its own ancestors only, through a 4D
   additive mask (:mod:`specstudy.engine.tokentree`);
3. a path from the root is accepted and the next token picked (:func:`verify_tree`);
4. the cache keeps the path's keys/values only; the path's drafted tokens and the next token
   are emitted, the next token is the new root.

Acceptance along the tree (step 3), with p_i the target's distribution after node i:

* greedy — walk from the root; at node i take x = argmax p_i; if a child carries x, move to it,
  else stop.  x at the last node is the bonus token.  Lossless.
* sampling — SpecInfer's multi-step speculative sampling.  The children of node i were drawn
  i.i.d. from the draft distribution q_i; try them in order: accept child x iff
  u · q_i(x) < p(x) (probability min(1, p(x)/q_i(x))), else p ← norm(max(p − q_i, 0)) — the
  rejection step of :mod:`specstudy.engine.verify`, sibling after sibling, starting from
  p = p_i.  When every child is rejected the next token is drawn from the last p.  Each
  sibling test is an ordinary speculative-sampling step against the current residual, so the
  emitted token is distributed exactly as p_i (Miao et al. 2024).
* synthetic (option ``synthetic_acceptance``, benchmark-only, :mod:`specstudy.synthetic`):
  the path is the first-child chain (root, its first child, that one's first child, ...) cut
  after the number of nodes the rule keeps; the next token is the target's choice after it
  (argmax, or a sample of p after every child of the last node was rejected).  Not lossless.

Per-step counts (:class:`~specstudy.records.StepRecord`): ``drafted`` is the tree depth (the
longest candidate path, the quantity per-position acceptance is defined over), ``accepted`` the
accepted path length; the drafted nodes verified over a request are counted on its
:class:`~specstudy.engine.trace.RowTrace` as ``tree_nodes``.

Drafters (cell.drafter): a draft model (its top-k / samples at every node, one drafter forward
per tree level, with the same tree mask on its own cache), ``self[:K]`` (the target's first K
layers, self-speculation) or a trained ``layer_skip_adapter`` file.  Medusa-style heads grow
trees too (:mod:`specstudy.engine.methods.heads`, option ``heads_tree``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from ...drafter_names import SELF
from ...synthetic import SyntheticAcceptance, parse_synthetic
from ..drafters import load_drafter, resolve_drafter_path
from ..kv import cache_arg, new_cache
from ..lean import lean_cache
from ..sampling import next_tokens, probs_for, sample_from
from ..tokentree import (
    TokenTree,
    causal_forward,
    keep_cache_positions,
    model_device,
    model_dtype,
    tree_attention_mask,
    tree_forward,
    tree_position_ids,
)
from ..trace import BatchTrace, RowTrace, Timer
from ..verify import residual
from . import SYNTHETIC, DecodeJob, EngineMethod, positive_int, synthetic_acceptance
from .layer_skip import early_exit_draft

#: what a study is checked against, read as a literal (no import, no torch) by
#: specstudy.frameworks.reference; SPEC below is built from it
HEADER = {
    "name": "tree",
    "family": "tree",
    "order": 50,
    "needs_drafter": True,
    "uses_gamma": True,
    "max_batch": 1,
    "options": ("tree_width", "tree_branching", "synthetic_acceptance"),
    "title": "Token-tree verification",
    "tree": True,
    "describe": "a token tree of depth {gamma}, verified in one forward (tree mask)",
}

# --------------------------------------------------------------------------------------------
# building trees


def parse_branching(value: str | Sequence[int]) -> tuple[int, ...]:
    """ "3,1,1" or (3, 1, 1) → (3, 1, 1): children per node at each depth (the tree's shape)."""
    try:
        b = tuple(int(x) for x in (value.split(",") if isinstance(value, str) else value))
    except (TypeError, ValueError):
        raise ValueError(
            f"tree_branching={value!r}: expected comma-separated positive integers, e.g. '3,1,1'"
        ) from None
    if not b or any(x < 1 for x in b):
        raise ValueError(f"tree_branching={value!r}: expected positive integers, e.g. '3,1,1'")
    return b


def default_branching(width: int, depth: int) -> tuple[int, ...]:
    """``width`` independent chains of length ``depth`` (width children at the root, then 1)."""
    if width < 1 or depth < 1:
        raise ValueError(f"tree_width={width!r} and tree_depth={depth!r} must both be >= 1")
    return (width,) + (1,) * (depth - 1)


def pick_children(q: torch.Tensor, k: int, greedy: bool, generator: torch.Generator | None) -> list[int]:
    """k child tokens from draft distribution ``q`` (V,).

    Greedy: the k most likely distinct tokens.  Sampling: k i.i.d. draws (with replacement), as
    multi-step speculative sampling requires for its exactness.
    """
    if greedy:
        return torch.topk(q, k).indices.tolist()
    return torch.multinomial(q, k, replacement=True, generator=generator).tolist()


# --------------------------------------------------------------------------------------------
# accepting a path


@dataclass
class TreeVerdict:
    """Outcome of one tree verification: the accepted node path and the next pending token."""

    path: list[int]  # node ids from the root, root included
    next_token: int

    @property
    def accepted(self) -> int:
        return len(self.path) - 1


def accept_greedy(tree: TokenTree, target_logits: torch.Tensor) -> TreeVerdict:
    """Greedy walk: follow the child equal to the target's argmax; the last argmax is the bonus."""
    best = target_logits.argmax(dim=-1).tolist()
    node, path = 0, [0]
    while True:
        nxt = next((c for c in tree.children(node) if tree.tokens[c] == best[node]), None)
        if nxt is None:
            return TreeVerdict(path=path, next_token=best[node])
        node = nxt
        path.append(node)


def accept_sampling(
    tree: TokenTree,
    target_probs: torch.Tensor,
    accept_step: Callable[[torch.Tensor, torch.Tensor, int, torch.Generator | None], tuple[bool, torch.Tensor]],
    sample: Callable[[torch.Tensor, torch.Generator | None], int],
    generator: torch.Generator | None,
) -> TreeVerdict:
    """Multi-step speculative sampling over the tree (recursive rejection over siblings).

    ``target_probs[i]`` is the target's (processed) next-token distribution after node i;
    ``accept_step(p, q, x, gen) -> (accepted, residual)`` is the single rejection step;
    ``sample(p, gen)`` draws one token.
    """
    node, path = 0, [0]
    while True:
        p = target_probs[node]
        moved = False
        for c in tree.children(node):
            ok, p_res = accept_step(p, tree.child_q[node], tree.tokens[c], generator)
            if ok:
                node, moved = c, True
                path.append(c)
                break
            p = p_res
        if not moved:
            return TreeVerdict(path=path, next_token=sample(p, generator))


def sibling_step(
    p: torch.Tensor, q: torch.Tensor, token: int, generator: torch.Generator | None
) -> tuple[bool, torch.Tensor]:
    """One rejection test of a sibling drawn from ``q`` against the current target mass ``p``:
    accepted iff u · q(x) < p(x), i.e. with probability min(1, p/q); otherwise the next sibling
    is tested against :func:`specstudy.engine.verify.residual` norm(max(p − q, 0))."""
    u = torch.rand((), generator=generator, dtype=p.dtype, device=p.device)
    if bool(u * q[token] < p[token]):
        return True, p
    return False, residual(p, q)


def sample_token(p: torch.Tensor, generator: torch.Generator | None) -> int:
    return int(sample_from(p, generator))


def first_child_chain(tree: TokenTree) -> list[int]:
    """Root, its first child, that one's first child, ... to a leaf: the path synthetic
    acceptance walks (the drafter's most likely, or first sampled, continuation)."""
    path = [0]
    while kids := tree.children(path[-1]):
        path.append(kids[0])
    return path


def accept_synthetic(
    tree: TokenTree,
    target_logits: torch.Tensor,
    sampling,
    kept: Callable[[torch.Tensor], torch.Tensor],
    generator: torch.Generator | None,
) -> TreeVerdict:
    """The first-child chain cut after ``kept(chain length)`` nodes; then the target's choice:
    argmax, or a sample of p after every child of the last node was rejected (as
    :func:`accept_sampling` ends when no sibling is accepted)."""
    chain = first_child_chain(tree)
    n = int(kept(torch.tensor([len(chain) - 1]))[0])
    path = chain[: n + 1]
    node = path[-1]
    if sampling.greedy:
        return TreeVerdict(path=path, next_token=int(target_logits[node].argmax()))
    p = probs_for(target_logits[node], sampling)
    for _ in tree.children(node):
        p = residual(p, tree.child_q[node])
    return TreeVerdict(path=path, next_token=sample_token(p, generator))


def verify_tree(
    tree: TokenTree,
    target_logits: torch.Tensor,
    sampling,
    generator: torch.Generator | None,
    kept: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> TreeVerdict:
    """Step 3 of the loop: the accepted path and the next token (greedy walk, multi-draft
    sampling, or the synthetic rule ``kept`` when given)."""
    if kept is not None:
        return accept_synthetic(tree, target_logits, sampling, kept, generator)
    if sampling.greedy:
        return accept_greedy(tree, target_logits)
    return accept_sampling(tree, probs_for(target_logits, sampling), sibling_step, sample_token, generator)


# --------------------------------------------------------------------------------------------
# growing a tree with a small causal LM


@torch.no_grad()
def lm_forward(
    model,
    cache,
    past_len: int,
    tokens: Sequence[int],
    parents: Sequence[int] | None = None,
    rows: Sequence[int] | None = None,
) -> torch.Tensor:
    """A drafter LM called like a causal LM (any transformers model, or a layer-skip view).

    Without ``parents``: ``tokens`` fed causally.  With ``parents``: tree nodes ``rows`` (one
    contiguous breadth-first slice; earlier nodes already cached) fed with the tree mask.
    Returns logits ``[k, V]``.
    """
    dev = model_device(model)
    if parents is None:
        ids = list(tokens)
        pos = torch.arange(past_len, past_len + len(ids), device=dev)[None]
        mask = None
    else:
        rows = list(rows)
        if rows != list(range(rows[0], rows[-1] + 1)):
            raise ValueError(f"rows={rows}: a contiguous breadth-first slice is needed")
        ids = [tokens[r] for r in rows]
        pos = tree_position_ids(parents, past_len, rows=rows).to(dev)
        mask = tree_attention_mask(parents, past_len, model_dtype(model), rows=rows, n_cols=rows[-1] + 1).to(dev)
    out = model(
        input_ids=torch.tensor([ids], device=dev),
        attention_mask=mask,
        position_ids=pos,
        use_cache=True,
        **cache_arg(model, cache),
    )
    return out.logits[0]


class ModelTreeDrafter:
    """Grows a token tree with a drafter LM, one drafter forward per tree level.

    The drafter keeps its own KV cache of committed tokens; each level's new nodes are fed with
    the same tree mask as the target's, and after verification only the accepted path stays.
    Children of a node are its ``b`` most likely tokens (greedy) or ``b`` i.i.d. samples from
    its distribution (sampling), ``b`` given per depth by ``branching``.
    """

    def __init__(self, model, branching: Sequence[int], sampling):
        self.model, self.branching, self.sampling = model, tuple(branching), sampling
        self.cache = new_cache(model)
        self.cached = 0  # committed tokens in the drafter's cache
        self._past = 0
        self._fed = 0

    def _q(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.sampling.greedy else probs_for(logits, self.sampling)

    def start(self, prompt_hidden: torch.Tensor) -> None:
        """Nothing to do: the drafter reads the prompt on its first :meth:`propose`."""

    @torch.no_grad()
    def propose(
        self, committed: Sequence[int], root: int, max_depth: int, generator: torch.Generator | None
    ) -> TokenTree:
        catch_up = list(committed[self.cached :]) + [int(root)]
        logits = lm_forward(self.model, self.cache, self.cached, catch_up)
        past = len(committed)
        tree = TokenTree(tokens=[int(root)], parents=[-1])
        dist = {0: self._q(logits[-1])}
        frontier, fed = [0], 1
        shape = self.branching[:max_depth]
        for d, b in enumerate(shape):
            new = []
            for f in frontier:
                if not self.sampling.greedy:
                    tree.child_q[f] = dist[f]
                new += [tree.add(f, t) for t in pick_children(dist[f], b, self.sampling.greedy, generator)]
            if d + 1 < len(shape):
                lg = lm_forward(self.model, self.cache, past, tree.tokens, tree.parents, rows=new)
                dist.update({n: self._q(lg[i]) for i, n in enumerate(new)})
                fed = new[-1] + 1
            frontier = new
        self._past, self._fed = past, fed
        return tree

    def accept(self, path: Sequence[int], hidden: torch.Tensor) -> None:
        """Keep the accepted nodes the drafter has seen; the rest is fed on the next catch-up."""
        keep = [n for n in path if n < self._fed]
        keep_cache_positions(self.cache, self._past, keep)
        self.cached = self._past + len(keep)


# --------------------------------------------------------------------------------------------
# the loop (batch 1: every request is its own tree)


class TreeDrafter(Protocol):
    """What :func:`tree_decode` needs from a drafter (a protocol; :class:`ModelTreeDrafter`
    and the heads' tree drafter implement it)."""

    def start(self, prompt_hidden: torch.Tensor) -> None:
        """After the prefill: the target's last hidden state at the prompt's last token."""

    def propose(
        self, committed: Sequence[int], root: int, max_depth: int, generator: torch.Generator | None
    ) -> TokenTree:
        """A tree under ``root`` after the ``committed`` tokens, at most ``max_depth`` deep."""

    def accept(self, path: Sequence[int], hidden: torch.Tensor) -> None:
        """The target accepted ``path``; ``hidden`` is its last hidden state at the path's end."""


def tree_decode(
    target,
    prompt: Sequence[int],
    sampling,
    drafter: TreeDrafter,
    generator: torch.Generator | None,
    eos_token_ids: Sequence[int] = (),
    device: str | torch.device = "cpu",
    synthetic: SyntheticAcceptance | None = None,
    verify: Callable[[TokenTree, torch.Tensor, Any, torch.Generator | None], TreeVerdict] | None = None,
) -> RowTrace:
    """Decode one prompt: prefill, then per step grow a tree, verify it in one target pass, keep
    the accepted path (steps 1-4 of the module docstring).  Returns the row's
    :class:`~specstudy.engine.trace.RowTrace`; ``row.tree_nodes`` counts the drafted nodes
    verified.  ``synthetic``: keep paths at a fixed rate instead (benchmark-only).  ``verify``
    replaces step 3's :func:`verify_tree` for trees that carry more than one draft distribution
    per parent (:func:`specstudy.engine.proposals.accept_proposals`).
    """
    trace = BatchTrace([prompt], sampling.max_new_tokens, eos_token_ids, sampling.ignore_eos, device)
    row = trace.rows[0]
    row.tree_nodes = 0
    cache = lean_cache(target, 1, torch.device(device)) or new_cache(target)  # the lean forward where it runs
    root = _prefill(target, cache, trace, drafter, sampling, generator, device)
    kept = synthetic.draws(sampling.seed) if synthetic is not None else None
    committed = list(row.prompt_ids)
    while not trace.done:
        with Timer(device) as td:
            tree = drafter.propose(committed, root, max(0, row.remaining - 1), generator)  # 1
        with Timer(device) as tv:
            hidden, logits = tree_forward(target, cache, len(committed), tree)  # 2
            if verify is None:
                verdict = verify_tree(tree, logits, sampling, generator, kept)  # 3
            else:
                verdict = verify(tree, logits, sampling, generator)
            keep_cache_positions(cache, len(committed), verdict.path)  # 4
        drafter.accept(verdict.path, hidden[verdict.path[-1]])
        committed += [tree.tokens[n] for n in verdict.path]
        root = _emit_path(trace, tree, verdict, logits, td.s, tv.s)
    return row


def _prefill(
    target,
    cache,
    trace: BatchTrace,
    drafter: TreeDrafter,
    sampling,
    generator: torch.Generator | None,
    device: str | torch.device,
) -> int:
    """The prompt pass (a step of its own that emits the first token, as in ``ar``); returns
    that token, the first root."""
    row = trace.rows[0]
    with Timer(device) as tv:
        hidden, logits = causal_forward(target, cache, 0, row.prompt_ids, last_only=True)
    root = int(next_tokens(logits[-1], sampling, generator))
    trace.emit([[root]], logits[None], 0, 0, None, tv.s)
    drafter.start(hidden[-1])
    return root


def _emit_path(
    trace: BatchTrace, tree: TokenTree, verdict: TreeVerdict, logits: torch.Tensor, draft_s: float, verify_s: float
) -> int:
    """Emit the path's drafted tokens and the next token (scored by the logits at the path's
    nodes); returns the next token, the next root."""
    emitted = [tree.tokens[n] for n in verdict.path[1:]] + [verdict.next_token]
    row = trace.rows[0]
    row.tree_nodes = (row.tree_nodes or 0) + len(tree) - 1  # 0 from the prefill on
    trace.emit([emitted], logits[verdict.path][None], tree.depth, verdict.accepted, draft_s, verify_s)
    return verdict.next_token


# --------------------------------------------------------------------------------------------
# the method: the drafter is a draft model, or the target's own first layers


def _branching(options, gamma: int | None) -> tuple[int, ...]:
    opts = dict(options)
    if "tree_branching" in opts:
        return tuple(opts["tree_branching"])
    return default_branching(opts.get("tree_width", 2), gamma)


def _self_exit_layer(name: str) -> int | None:
    """``self`` → None (half the layers), ``self:K`` → K; raises on a malformed suffix."""
    _, _, k = name.partition(":")
    if not k:
        return None
    if not k.isdigit() or int(k) < 1:
        raise ValueError(f"drafter={name!r}: expected 'self' or 'self:K' with K >= 1 layers kept")
    return int(k)


def load_tree_drafter(name: str, target, device: str = "cpu", dtype: str = "float32"):
    """cell.drafter → the LM that grows the tree.

    ``self`` / ``self:K``: the target's first K layers (default half) with its norm and LM head;
    a ``layer_skip_adapter`` file from ``specstudy train-drafter``: the same plus the trained
    adapter (K from the file); anything else: a draft model from :mod:`specstudy.data.model_files`.
    """
    if name == SELF or name.startswith(SELF + ":"):
        k = _self_exit_layer(name)
        return early_exit_draft(target, {} if k is None else {"exit_layer": k}, device)
    if str(name).endswith(".safetensors"):
        adapter = load_drafter(name, kind="layer_skip_adapter", hidden_size=target.config.hidden_size)
        return early_exit_draft(target, {"adapter": adapter}, device)
    # the model registry (config, pydantic) only for a drafter named by model: the engine itself
    # imports none of the kit's configuration (bench/gpu_check.py runs it where pydantic is absent)
    from ...data.model_files import load_model

    return load_model(name, device, dtype)[0]


def check_one_request(job: DecodeJob, method: str) -> None:
    """Tree methods verify one request's tree per target forward (no batched trees)."""
    if len(job.prompts) != 1:
        raise ValueError(f"method {method!r} decodes one request at a time: batch_size={len(job.prompts)}")


def check_same_vocab(draft: Any, target: Any) -> None:
    """A draft LM's tokens index the target's logits: the vocabularies must be one."""
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft vocab_size={draft.config.vocab_size} differs from the target's {target.config.vocab_size}"
        )


def decode(job: DecodeJob) -> list[RowTrace]:
    check_one_request(job, "tree")
    model = job.drafter
    check_same_vocab(model, job.target)
    drafter = ModelTreeDrafter(model, _branching(job.options, job.draft_length), job.sampling)
    return [
        tree_decode(
            job.target,
            job.prompts[0],
            job.sampling,
            drafter,
            job.generator(),
            job.eos_token_ids,
            job.device,
            synthetic_acceptance(job),
        )
    ]


def _check_drafter_name(name: str) -> None:
    if name == SELF or name.startswith(SELF + ":"):
        _self_exit_layer(name)
    elif name.endswith(".safetensors"):
        from safetensors import safe_open

        name = str(resolve_drafter_path(name))
        if not Path(name).exists():
            raise ValueError(
                f"drafter={name!r}: no such file (train one with `specstudy train-drafter --kind layer_skip_adapter`)"
            )
        with safe_open(name, framework="pt") as f:
            kind = (f.metadata() or {}).get("kind")
        if kind != "layer_skip_adapter":
            raise ValueError(
                f"drafter={name!r} holds drafter kind {kind!r}; the tree method grows trees with an LM: "
                "a draft model, 'self[:K]' or a layer_skip_adapter file"
            )


@dataclass(frozen=True)
class TreeSpec(EngineMethod):
    """Checks the drafter name and the tree shape against γ before any model is loaded."""

    def check(self, gamma: int | None, batch_size: int, drafter: Any, options) -> dict[str, Any]:
        out = EngineMethod.check(self, gamma, batch_size, drafter, options)
        if isinstance(drafter, str):
            _check_drafter_name(drafter)
        if "tree_branching" in out:
            if "tree_width" in out:
                raise ValueError("method 'tree': give tree_branching or tree_width, not both")
            if len(out["tree_branching"]) != gamma:
                raise ValueError(
                    f"method 'tree': tree_branching={','.join(map(str, out['tree_branching']))} "
                    f"has depth {len(out['tree_branching'])}, but gamma={gamma}: the tree depth "
                    "is gamma"
                )
        return out


SPEC = TreeSpec.from_header(
    HEADER,
    decode=decode,
    load_drafter=load_tree_drafter,
    options={"tree_width": positive_int, "tree_branching": parse_branching, SYNTHETIC: parse_synthetic},
    description="multi-draft token tree verified in one target pass (tree attention mask); "
    "drafter: a draft model, 'self[:K]' (the target's first K layers) or a "
    "layer_skip_adapter file",
)
