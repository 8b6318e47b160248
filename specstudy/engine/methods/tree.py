"""``tree`` — multi-draft token-tree verification (SpecInfer / Sequoia style).

Several candidate continuations share their prefixes in a token tree.  The target checks the
whole tree in ONE forward: every node attends to the committed prefix (the KV cache) and to its
own ancestors only (a 4D tree attention mask), at position ``past + depth``.  The longest valid
path is accepted and only its keys/values are kept in the cache.

Node 0 is the *root*: the pending token (sampled last step, not yet in the cache).  Nodes are in
breadth-first order, so ``parents[i] < i`` and each depth is one contiguous block.

Acceptance along the tree:

* greedy — walk from the root; at each node take the target's argmax; if a child carries that
  token, move to it, else stop.  The argmax at the last node is the bonus token.  Lossless.
* sampling — SpecInfer's multi-step speculative sampling: the children of a node were drawn
  i.i.d. from the draft distribution ``q`` at that node; try them in order, accepting child x
  with probability min(1, p(x)/q(x)) and, after each rejection, replacing p by the residual
  norm(max(p − q, 0)) — the one rejection step of :mod:`specstudy.engine.verify` applied
  sibling after sibling.  When every child is rejected, the next token is drawn from the
  final residual.  Each sibling test is an ordinary speculative-sampling step against the
  current residual, so the emitted token is distributed exactly as p (SpecInfer, Miao et al. 2024).

Per-step counts (:class:`~specstudy.records.StepRecord`): ``drafted`` is the tree depth (the
longest candidate path, the quantity per-position acceptance is defined over), ``accepted`` the
accepted path length; the drafted nodes verified over a request are counted on its
:class:`~specstudy.engine.trace.RowTrace` as ``tree_nodes``.

Drafters (cell.drafter): a draft model (its top-k / samples at every node, one drafter forward
per tree level, with the same tree mask on its own cache), ``self[:K]`` (the target's first K
layers, self-speculation) or a trained ``layer_skip_adapter`` file.  Medusa-style heads grow
trees too (:mod:`specstudy.engine.methods.heads`, option ``heads_tree``).  Batch size 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

# --------------------------------------------------------------------------------------------
# the tree and its attention mask


@dataclass
class TokenTree:
    """Candidate tokens in breadth-first order; node 0 is the root (the pending token).

    ``child_q[i]`` is the draft distribution node i's children were drawn from (needed only for
    sampling; greedy trees leave it empty).
    """

    tokens: list[int]
    parents: list[int]
    child_q: dict[int, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError(f"tokens ({len(self.tokens)}) and parents ({len(self.parents)}) differ in length")
        if not self.parents or self.parents[0] != -1:
            raise ValueError("node 0 must be the root (parent -1)")
        for i, p in enumerate(self.parents[1:], start=1):
            if not 0 <= p < i:
                raise ValueError(f"parents[{i}]={p}: a parent must precede its child (breadth-first order)")

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depths(self) -> list[int]:
        d = [0] * len(self.parents)
        for i, p in enumerate(self.parents[1:], start=1):
            d[i] = d[p] + 1
        return d

    @property
    def depth(self) -> int:
        """Length of the longest candidate path (the root excluded)."""
        return max(self.depths)

    def children(self, node: int) -> list[int]:
        return [i for i, p in enumerate(self.parents) if p == node]

    def add(self, parent: int, token: int) -> int:
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        return len(self.tokens) - 1


def ancestor_matrix(parents: Sequence[int]) -> torch.Tensor:
    """(N, N) bool: ``m[i, j]`` is True iff node j is node i or one of its ancestors."""
    n = len(parents)
    m = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        m[i, i] = True
        if parents[i] >= 0:
            m[i] |= m[parents[i]]
    return m


def tree_attention_mask(parents: Sequence[int], past_len: int, dtype: torch.dtype = torch.float32,
                        rows: Sequence[int] | None = None, n_cols: int | None = None) -> torch.Tensor:
    """Additive 4D mask (1, 1, R, past_len + C) for feeding tree nodes after a cache of ``past_len``.

    Row r (tree node ``rows[r]``) may see every cached position and the tree nodes that are its
    ancestors or itself; tree node j sits at key index ``past_len + j``.  0 = attend, dtype min =
    masked (transformers passes a 4D mask through unchanged to eager and SDPA attention).
    ``rows``/``n_cols`` select a slice, for a drafter that feeds one tree level at a time.
    """
    anc = ancestor_matrix(parents)
    rows = list(range(len(parents))) if rows is None else list(rows)
    n_cols = len(parents) if n_cols is None else n_cols
    allowed = torch.cat([torch.ones(len(rows), past_len, dtype=torch.bool), anc[rows][:, :n_cols]], dim=1)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def tree_position_ids(parents: Sequence[int], past_len: int, rows: Sequence[int] | None = None) -> torch.Tensor:
    """(1, R) positions: a node at depth d sits at ``past_len + d`` (siblings share a position)."""
    depths = TokenTree(tokens=[0] * len(parents), parents=list(parents)).depths
    rows = range(len(parents)) if rows is None else rows
    return torch.tensor([[past_len + depths[r] for r in rows]], dtype=torch.long)


# --------------------------------------------------------------------------------------------
# building trees


def parse_branching(value: str | Sequence[int]) -> tuple[int, ...]:
    """"3,1,1" or (3, 1, 1) → (3, 1, 1): children per node at each depth (the tree's shape)."""
    try:
        b = tuple(int(x) for x in (value.split(",") if isinstance(value, str) else value))
    except (TypeError, ValueError):
        raise ValueError(f"tree_branching={value!r}: expected comma-separated positive integers, e.g. '3,1,1'")
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


def accept_sampling(tree: TokenTree, target_probs: torch.Tensor,
                    accept_step: Callable[[torch.Tensor, torch.Tensor, int, torch.Generator | None],
                                          tuple[bool, torch.Tensor]],
                    sample: Callable[[torch.Tensor, torch.Generator | None], int],
                    generator: torch.Generator | None) -> TreeVerdict:
    """Multi-step speculative sampling over the tree (recursive rejection over siblings).

    ``target_probs[i]`` is the target's (processed) next-token distribution after node i;
    ``accept_step(p, q, x, gen) -> (accepted, residual)`` is the single rejection step;
    ``sample(p, gen)`` draws one token.
    """
    node, path = 0, [0]
    while True:
        p = target_probs[node]
        kids = tree.children(node)
        moved = False
        for c in kids:
            ok, p_res = accept_step(p, tree.child_q[node], tree.tokens[c], generator)
            if ok:
                node, moved = c, True
                path.append(c)
                break
            p = p_res
        if not moved:
            return TreeVerdict(path=path, next_token=sample(p, generator))


def sibling_step(p: torch.Tensor, q: torch.Tensor, token: int,
                 generator: torch.Generator | None) -> tuple[bool, torch.Tensor]:
    """One rejection test of a sibling drawn from ``q`` against the current target mass ``p``.

    The same rule as :func:`specstudy.engine.verify.verify_sampling` (accept iff u·q(x) < p(x),
    i.e. with probability min(1, p/q); otherwise continue with norm(max(p − q, 0)), or p itself
    when p == q leaves no residual mass), but returning the residual *distribution*, which the
    next sibling is tested against.
    """
    u = torch.rand((), generator=generator, dtype=p.dtype, device=p.device)
    if bool(u * q[token] < p[token]):
        return True, p
    residual = torch.clamp(p - q, min=0.0)
    mass = residual.sum()
    return False, (residual / mass if bool(mass > 0) else p)


# --------------------------------------------------------------------------------------------
# KV cache: keep the accepted path only


def keep_cache_positions(cache, past_len: int, keep: Sequence[int]) -> None:
    """Keep the first ``past_len`` cached positions plus ``past_len + j`` for j in ``keep``.

    The accepted path's entries move to ``past_len, past_len + 1, ...`` — exactly where a plain
    causal decode would have put them (their rotary positions already are past_len + depth).
    """
    idx = torch.tensor(list(keep), dtype=torch.long) + past_len
    for layer in cache.layers:
        if getattr(layer, "is_sliding", False):
            raise ValueError("tree verification needs full-attention KV layers; this cache has a sliding-window layer")
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        dev = layer.keys.device
        layer.keys = torch.cat([layer.keys[..., :past_len, :], layer.keys.index_select(-2, idx.to(dev))], dim=-2)
        layer.values = torch.cat([layer.values[..., :past_len, :], layer.values.index_select(-2, idx.to(dev))], dim=-2)


# --------------------------------------------------------------------------------------------
# forwards: the target (hidden states + logits) and a drafter LM (logits)


def base_and_head(model) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(decoder stack returning the last hidden state, LM head) of a transformers causal LM."""
    return getattr(model, model.base_model_prefix), model.get_output_embeddings()


def _first_param(model) -> torch.Tensor:
    """A parameter of ``model`` (a layer-skip view registers none of its own: ask its target)."""
    p = next(model.parameters(), None)
    return p if p is not None else next(model._target.parameters())


def _device(model) -> torch.device:
    return _first_param(model).device


def _dtype(model) -> torch.dtype:
    p = _first_param(model)
    return p.dtype if p.dtype.is_floating_point else torch.float32


@torch.no_grad()
def tree_forward(model, cache, past_len: int, tree: TokenTree) -> tuple[torch.Tensor, torch.Tensor]:
    """The target over every tree node after ``past_len`` cached tokens, in one pass.

    Returns ``(hidden [N, H], logits [N, V])``: the last hidden state (after the final norm) and
    the next-token logits after each node.
    """
    base, lm_head = base_and_head(model)
    dev = _device(model)
    out = base(input_ids=torch.tensor([tree.tokens], device=dev),
               attention_mask=tree_attention_mask(tree.parents, past_len, _dtype(model)).to(dev),
               position_ids=tree_position_ids(tree.parents, past_len).to(dev),
               cache=cache, use_cache=True)
    hidden = out.last_hidden_state[0]
    return hidden, lm_head(hidden)


@torch.no_grad()
def causal_forward(model, cache, past_len: int, tokens: Sequence[int], last_only: bool = False
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """The target over ``tokens`` causally (the prefill): ``(hidden [k, H], logits [k or 1, V])``."""
    base, lm_head = base_and_head(model)
    dev = _device(model)
    pos = torch.arange(past_len, past_len + len(tokens), device=dev)[None]
    out = base(input_ids=torch.tensor([list(tokens)], device=dev), position_ids=pos, cache=cache, use_cache=True)
    hidden = out.last_hidden_state[0]
    return hidden, lm_head(hidden[-1:] if last_only else hidden)


@torch.no_grad()
def lm_forward(model, cache, past_len: int, tokens: Sequence[int], parents: Sequence[int] | None = None,
               rows: Sequence[int] | None = None) -> torch.Tensor:
    """A drafter LM called like a causal LM (any transformers model, or a layer-skip view).

    Without ``parents``: ``tokens`` fed causally.  With ``parents``: tree nodes ``rows`` (one
    contiguous breadth-first slice; earlier nodes already cached) fed with the tree mask.
    Returns logits ``[k, V]``.
    """
    dev = _device(model)
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
        mask = tree_attention_mask(parents, past_len, _dtype(model), rows=rows, n_cols=rows[-1] + 1).to(dev)
    out = model(input_ids=torch.tensor([ids], device=dev), attention_mask=mask, position_ids=pos,
                cache=cache, use_cache=True)
    return out.logits[0]


# --------------------------------------------------------------------------------------------
# growing a tree with a small causal LM


class ModelTreeDrafter:
    """Grows a token tree with a drafter LM, one drafter forward per tree level.

    The drafter keeps its own KV cache of committed tokens; each level's new nodes are fed with
    the same tree mask as the target's, and after verification only the accepted path stays.
    Children of a node are its ``b`` most likely tokens (greedy) or ``b`` i.i.d. samples from
    its distribution (sampling), ``b`` given per depth by ``branching``.
    """

    def __init__(self, model, branching: Sequence[int], sampling):
        from ..kv import new_cache

        self.model, self.branching, self.sampling = model, tuple(branching), sampling
        self.cache = new_cache(model)
        self.cached = 0  # committed tokens in the drafter's cache
        self._past = 0
        self._fed = 0

    def _q(self, logits: torch.Tensor) -> torch.Tensor:
        from ..sampling import probs_for

        return logits if self.sampling.greedy else probs_for(logits, self.sampling)

    def start(self, prompt_hidden: torch.Tensor) -> None:
        """Nothing to do: the drafter reads the prompt on its first :meth:`propose`."""

    @torch.no_grad()
    def propose(self, committed: Sequence[int], root: int, max_depth: int,
                generator: torch.Generator | None) -> TokenTree:
        catch_up = list(committed[self.cached:]) + [int(root)]
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


def tree_decode(target, prompt: Sequence[int], sampling, drafter, generator: torch.Generator | None,
                eos_token_ids: Sequence[int] = (), device: str | torch.device = "cpu"):
    """Decode one prompt: prefill, then per step grow a tree, verify it in one target pass,
    keep the accepted path.  ``drafter`` has ``start(h)``, ``propose(committed, root, max_depth,
    gen) -> TokenTree`` and ``accept(path, h)`` (h: the target's last hidden state at the path's
    end, which head drafters read).  Returns the :class:`~specstudy.engine.trace.RowTrace`;
    ``row.tree_nodes`` counts the drafted nodes verified.
    """
    from ..kv import new_cache
    from ..sampling import next_tokens, probs_for, sample_from
    from ..trace import BatchTrace, Timer

    trace = BatchTrace([prompt], sampling.max_new_tokens, eos_token_ids, sampling.ignore_eos, device)
    row = trace.rows[0]
    row.tree_nodes = 0
    cache = new_cache(target)
    with Timer(device) as tv:
        hidden, logits = causal_forward(target, cache, 0, row.prompt_ids, last_only=True)
    root = int(next_tokens(logits[-1], sampling, generator))
    trace.emit([[root]], logits[None], 0, 0, None, tv.s)
    drafter.start(hidden[-1])
    committed = list(row.prompt_ids)

    def sample(p: torch.Tensor, gen: torch.Generator | None) -> int:
        return int(sample_from(p, gen))

    while not trace.done:
        with Timer(device) as td:
            tree = drafter.propose(committed, root, max(0, row.remaining - 1), generator)
        with Timer(device) as tv:
            hidden, logits = tree_forward(target, cache, len(committed), tree)
            if sampling.greedy:
                verdict = accept_greedy(tree, logits)
            else:
                verdict = accept_sampling(tree, probs_for(logits, sampling), sibling_step, sample, generator)
            keep_cache_positions(cache, len(committed), verdict.path)
        drafter.accept(verdict.path, hidden[verdict.path[-1]])
        committed += [tree.tokens[n] for n in verdict.path]
        emitted = [tree.tokens[n] for n in verdict.path[1:]] + [verdict.next_token]
        row.tree_nodes += len(tree) - 1
        trace.emit([emitted], logits[verdict.path][None], tree.depth, verdict.accepted, td.s, tv.s)
        root = verdict.next_token
    return row


# --------------------------------------------------------------------------------------------
# the method: the drafter is a draft model, or the target's own first layers


SELF_PREFIX = "self"


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
    adapter (K from the file); anything else: a draft model from :mod:`specstudy.data.models`.
    """
    from .layer_skip import early_exit_draft

    if name == SELF_PREFIX or name.startswith(SELF_PREFIX + ":"):
        k = _self_exit_layer(name)
        return early_exit_draft(target, {} if k is None else {"exit_layer": k}, device)
    if str(name).endswith(".safetensors"):
        from ..drafters import load_drafter

        adapter = load_drafter(name, kind="layer_skip_adapter", hidden_size=target.config.hidden_size)
        return early_exit_draft(target, {"adapter": adapter}, device)
    from ...models import load_model

    return load_model(name, device, dtype)[0]


def decode(job) -> list:
    if len(job.prompts) != 1:
        raise ValueError(f"method 'tree' decodes one request at a time: batch_size={len(job.prompts)}")
    model = job.drafter
    if model.config.vocab_size != job.target.config.vocab_size:
        raise ValueError(f"draft vocab_size={model.config.vocab_size} differs from the target's "
                         f"{job.target.config.vocab_size}")
    drafter = ModelTreeDrafter(model, _branching(job.options, job.gamma), job.sampling)
    return [tree_decode(job.target, job.prompts[0], job.sampling, drafter, job.generator(),
                        job.eos_token_ids, job.device)]


def _check_drafter_name(name: str) -> None:
    from pathlib import Path

    if name == SELF_PREFIX or name.startswith(SELF_PREFIX + ":"):
        _self_exit_layer(name)
    elif name.endswith(".safetensors"):
        from safetensors import safe_open

        from ..drafters import resolve_drafter_path

        name = str(resolve_drafter_path(name))
        if not Path(name).exists():
            raise ValueError(f"drafter={name!r}: no such file (train one with `specstudy train-drafter "
                             "--kind layer_skip_adapter`)")
        with safe_open(name, framework="pt") as f:
            kind = (f.metadata() or {}).get("kind")
        if kind != "layer_skip_adapter":
            raise ValueError(f"drafter={name!r} holds drafter kind {kind!r}; the tree method grows trees with an LM: "
                             "a draft model, 'self[:K]' or a layer_skip_adapter file")


def _make_spec():
    from dataclasses import dataclass

    from . import MethodSpec, positive_int

    @dataclass(frozen=True)
    class TreeSpec(MethodSpec):
        def check(self, gamma, batch_size, drafter, options):
            out = MethodSpec.check(self, gamma, batch_size, drafter, options)
            if isinstance(drafter, str):
                _check_drafter_name(drafter)
            if "tree_branching" in out:
                if "tree_width" in out:
                    raise ValueError("method 'tree': give tree_branching or tree_width, not both")
                if len(out["tree_branching"]) != gamma:
                    raise ValueError(f"method 'tree': tree_branching={','.join(map(str, out['tree_branching']))} "
                                     f"has depth {len(out['tree_branching'])}, but gamma={gamma}: the tree depth "
                                     "is gamma")
            return out

    return TreeSpec(name="tree", decode=decode, needs_drafter=True, max_batch=1, load_drafter=load_tree_drafter,
                    options={"tree_width": positive_int, "tree_branching": parse_branching},
                    description="multi-draft token tree verified in one target pass (tree attention mask); "
                                "drafter: a draft model, 'self[:K]' (the target's first K layers) or a "
                                "layer_skip_adapter file")


SPEC = _make_spec()
