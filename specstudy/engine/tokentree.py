"""A token tree as the target sees it: nodes, the tree attention mask, one-pass forwards, the cache.

Candidate continuations that share prefixes form a tree (:class:`TokenTree`, node 0 the root,
breadth-first order).  A transformer checks every node in ONE forward when node i sits at
position ``past + depth(i)`` and attends to the cached prefix and to its own ancestors only:

    mask[i, past + j] = 0 if j is i or an ancestor of i, else −∞;   mask[i, :past] = 0

(:func:`tree_attention_mask`; transformers passes a 4D additive mask through to eager and SDPA
attention unchanged).  After verification only the accepted path's keys/values stay, moved to
``past, past + 1, ...`` — where a plain causal decode would have put them
(:func:`keep_cache_positions`).  Used by the ``tree`` method and by Medusa-style heads in tree mode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from .kv import cache_arg
from .lean import StaticKV

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


def tree_attention_mask(
    parents: Sequence[int],
    past_len: int,
    dtype: torch.dtype = torch.float32,
    rows: Sequence[int] | None = None,
    n_cols: int | None = None,
) -> torch.Tensor:
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
# KV cache: keep the accepted path only


def keep_cache_positions(cache: Any, past_len: int, keep: Sequence[int]) -> None:
    """Keep the first ``past_len`` cached positions plus ``past_len + j`` for j in ``keep``.

    The accepted path's entries move to ``past_len, past_len + 1, ...`` — exactly where a plain
    causal decode would have put them (their rotary positions already are past_len + depth).
    """
    if isinstance(cache, StaticKV):
        cache.keep(past_len, list(keep))
        return
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
# forwards: the target over a tree (hidden states + logits) and over a prefix


def base_and_head(model: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(decoder stack returning the last hidden state, LM head) of a transformers causal LM."""
    return getattr(model, model.base_model_prefix), model.get_output_embeddings()


def _first_param(model: Any) -> torch.Tensor:
    """A parameter of ``model`` (a layer-skip view registers none of its own: ask its target)."""
    p: torch.Tensor | None = next(model.parameters(), None)
    return p if p is not None else next(model._target.parameters())


def model_device(model: Any) -> torch.device:
    return _first_param(model).device


def model_dtype(model: Any) -> torch.dtype:
    p = _first_param(model)
    return p.dtype if p.dtype.is_floating_point else torch.float32


@torch.no_grad()
def tree_forward(model: Any, cache: Any, past_len: int, tree: TokenTree) -> tuple[torch.Tensor, torch.Tensor]:
    """The target over every tree node after ``past_len`` cached tokens, in one pass.

    Returns ``(hidden [N, H], logits [N, V])``: the last hidden state (after the final norm) and
    the next-token logits after each node.
    """
    base, lm_head = base_and_head(model)
    dev = model_device(model)
    if isinstance(cache, StaticKV):
        return _lean_tree_forward(cache, past_len, tree, lm_head, dev)
    out = base(
        input_ids=torch.tensor([tree.tokens], device=dev),
        attention_mask=tree_attention_mask(tree.parents, past_len, model_dtype(model)).to(dev),
        position_ids=tree_position_ids(tree.parents, past_len).to(dev),
        use_cache=True,
        **cache_arg(base, cache),
    )
    hidden = out.last_hidden_state[0]
    return hidden, lm_head(hidden)


def _lean_tree_forward(
    cache: StaticKV, past_len: int, tree: TokenTree, lm_head: Any, dev: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`tree_forward` through the lean forward (:mod:`specstudy.engine.lean`): the same
    positions and tree mask, on its static cache."""
    if cache.length != past_len:
        raise ValueError(f"lean cache holds {cache.length} tokens, not past_len={past_len}")
    n = len(tree)
    allowed = torch.cat([torch.ones(n, past_len, dtype=torch.bool), ancestor_matrix(tree.parents)], dim=1)
    positions = tree_position_ids(tree.parents, past_len)[0]
    h = cache.hidden_forward(torch.tensor([tree.tokens], device=dev), positions.to(dev), allowed.to(dev))[0]
    return h, lm_head(h)


@torch.no_grad()
def causal_forward(
    model: Any, cache: Any, past_len: int, tokens: Sequence[int], last_only: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """The target over ``tokens`` causally (the prefill): ``(hidden [k, H], logits [k or 1, V])``."""
    base, lm_head = base_and_head(model)
    dev = model_device(model)
    if isinstance(cache, StaticKV):
        if cache.length != past_len:
            raise ValueError(f"lean cache holds {cache.length} tokens, not past_len={past_len}")
        h = cache.hidden_forward(torch.tensor([list(tokens)], device=dev))[0]
        return h, lm_head(h[-1:] if last_only else h)
    pos = torch.arange(past_len, past_len + len(tokens), device=dev)[None]
    out = base(
        input_ids=torch.tensor([list(tokens)], device=dev), position_ids=pos, use_cache=True, **cache_arg(base, cache)
    )
    hidden = out.last_hidden_state[0]
    return hidden, lm_head(hidden[-1:] if last_only else hidden)
