"""KV-cache state for speculative decoding: append, roll back rejected drafts, ragged batches.

A :class:`KVState` wraps one causal LM and its transformers ``DynamicCache``.  transformers
renamed the forward keyword of the cache from ``past_key_values=`` (5.17) to ``cache=`` (5.24);
an unknown keyword is swallowed by ``**kwargs`` and the model silently decodes without its
cache, so every call names it through :func:`cache_arg`.  Speculative decoding appends tokens that may be
rejected, so the cache must roll back; in a batch, rows accept different numbers of drafts.
Rather than copying caches per row, rejected or padding slots stay in the tensor as *holes*:
a per-row 0/1 ``mask`` over cache slots marks which slots are real, ``lengths[b]`` is row b's
count of real tokens (= the position id of its next token), and every forward passes that
mask as the attention mask and explicit per-row position ids.  Trailing columns that are holes
in every row are cropped off.  At batch size 1 nothing is ever a hole: rollback is a plain
``DynamicCache.crop`` and the forward passes no mask (the fast path).

Invariant used by every method: a model's cache holds the real tokens of each row in order,
so ``lengths[b]`` tokens of row b have been seen.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import torch

from .lean import StaticKV, lean_cache

#: the forward keyword of the KV cache, newest transformers first
CACHE_KEYWORDS = ("cache", "past_key_values")


@functools.cache
def _cache_keyword(fn: Callable[..., Any]) -> str:
    params = inspect.signature(fn).parameters
    for name in CACHE_KEYWORDS:
        if name in params:
            return name
    raise TypeError(
        f"{getattr(fn, '__qualname__', fn)!r} takes none of {list(CACHE_KEYWORDS)}: "
        "this transformers version passes the KV cache under another name"
    )


def cache_arg(fn: Callable[..., Any] | torch.nn.Module, cache: Any) -> dict[str, Any]:
    """``{keyword: cache}`` for a transformers callable (a module: its ``forward``), under the
    name the installed transformers uses (``cache`` or ``past_key_values``)."""
    if isinstance(fn, torch.nn.Module):
        fn = type(fn).forward
    return {_cache_keyword(inspect.unwrap(fn)): cache}


def pad_ragged(
    rows: Sequence[Sequence[int]],
    side: str = "left",
    pad_id: int = 0,
    width: int | None = None,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged token lists → ``(ids [B, W], valid [B, W] bool)`` padded on ``side``.

    Left padding puts every row's last token in the last column (read its logits at -1); right
    padding keeps each row's first token in column 0 (a verification block).
    """
    if side not in ("left", "right"):
        raise ValueError(f"side={side!r}: allowed 'left', 'right'")
    w = max((len(r) for r in rows), default=0) if width is None else width
    ids = torch.full((len(rows), w), pad_id, dtype=torch.long)
    valid = torch.zeros((len(rows), w), dtype=torch.bool)
    for b, r in enumerate(rows):
        if len(r) > w:
            raise ValueError(f"row {b} has {len(r)} tokens, more than width {w}")
        if not r:
            continue
        sl = slice(w - len(r), w) if side == "left" else slice(0, len(r))
        ids[b, sl] = torch.as_tensor(list(r), dtype=torch.long)
        valid[b, sl] = True
    return ids.to(device), valid.to(device)


def new_cache(model: Any) -> Any:  # a transformers DynamicCache
    """An empty ``DynamicCache`` for ``model`` (typed by its config when the model has one)."""
    from transformers import DynamicCache

    # a wrapper that runs only some of a model's layers (layer_skip) sets cache_config = None
    config = model.cache_config if hasattr(model, "cache_config") else getattr(model, "config", None)
    return DynamicCache(config=config) if config is not None else DynamicCache()


class KVState:
    """One model's KV cache for ``batch_size`` rows with per-row real-slot masks."""

    def __init__(self, model: Any, batch_size: int, device: str | torch.device = "cpu"):
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r}: must be >= 1")
        self.model = model
        self.device = torch.device(device)
        # batch 1 of a plain Llama: a static cache and the lean forward (:mod:`.lean`)
        self.cache: Any = lean_cache(model, batch_size, self.device) or new_cache(model)
        self.mask = torch.ones((batch_size, 0), dtype=torch.long, device=self.device)
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=self.device)
        self.has_holes = False

    @property
    def batch_size(self) -> int:
        return self.mask.shape[0]

    @property
    def slots(self) -> int:
        """Cache columns (real tokens plus holes)."""
        return self.mask.shape[1]

    @torch.no_grad()
    def forward(
        self, ids: torch.Tensor, valid: torch.Tensor | None = None, logits_to_keep: int = 0, **inputs: Any
    ) -> torch.Tensor:
        """Append ``ids [B, k]`` (``valid`` marks real tokens; False = hole) and return logits.

        ``logits_to_keep=1`` computes the LM head only for the last column (prefill, draft
        catch-up); 0 returns all ``k`` columns.  ``inputs``: further per-token model inputs
        (an EAGLE drafter's features); the whole model output stays in :attr:`last_output`.
        """
        if ids.dim() != 2 or ids.shape[0] != self.batch_size:
            raise ValueError(f"ids shape {tuple(ids.shape)}: need [{self.batch_size}, k]")
        ids = ids.to(self.device)
        all_valid = valid is None or bool(valid.all())
        if valid is None:
            valid = torch.ones(ids.shape, dtype=torch.bool, device=self.device)
        valid = valid.to(self.device)
        positions = (self.lengths[:, None] + torch.cumsum(valid.long(), dim=1) - 1).clamp(min=0)
        new_mask = torch.cat([self.mask, valid.long()], dim=1)
        self.has_holes = self.has_holes or not all_valid
        if isinstance(self.cache, StaticKV):
            if not all_valid or inputs:
                raise ValueError("the lean forward (batch 1) takes neither holes nor extra model inputs")
            out: Any = SimpleNamespace(logits=self.cache.forward(ids, logits_to_keep))
        else:
            out = self.model(
                input_ids=ids,
                attention_mask=new_mask if self.has_holes else None,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=logits_to_keep,
                **cache_arg(self.model, self.cache),
                **inputs,
            )
        self.last_output = out
        self.mask = new_mask
        self.lengths = self.lengths + valid.long().sum(dim=1)
        logits: torch.Tensor = out.logits
        return logits

    def rollback(self, n_remove: torch.Tensor | Sequence[int] | int) -> None:
        """Forget each row's last ``n_remove[b]`` real tokens (rejected drafts)."""
        n = torch.as_tensor(n_remove, dtype=torch.long, device=self.device)
        if n.dim() == 0:
            n = n.expand(self.batch_size)
        if n.shape != (self.batch_size,):
            raise ValueError(f"n_remove shape {tuple(n.shape)}: need [{self.batch_size}]")
        if bool((n < 0).any()) or bool((n > self.lengths).any()):
            raise ValueError(f"n_remove={n.tolist()} must lie in [0, lengths={self.lengths.tolist()}]")
        if not bool(n.any()):
            return
        if not self.has_holes and bool((n == n[0]).all()):
            k = int(n[0])
            self.cache.crop(-k)
            self.mask = self.mask[:, :-k]
            self.lengths = self.lengths - k
            return
        real_at_or_after = self.mask.flip(1).cumsum(1).flip(1)
        drop = (self.mask == 1) & (real_at_or_after <= n[:, None])
        self.mask = self.mask.masked_fill(drop, 0)
        self.lengths = self.lengths - n
        self.has_holes = True
        self._trim_tail()

    def _trim_tail(self) -> None:
        """Crop trailing columns that are holes in every row."""
        col_real = self.mask.any(dim=0)
        if bool(col_real.all()):
            self.has_holes = not bool(self.mask.all())
            return
        nz = torch.nonzero(col_real)
        keep = int(nz[-1]) + 1 if nz.numel() else 0
        cut = self.slots - keep
        if cut > 0:
            if keep == 0:
                self.cache = new_cache(self.model)
            else:
                self.cache.crop(-cut)
            self.mask = self.mask[:, :keep]
        self.has_holes = not bool(self.mask.all())

    def select_rows(self, rows: torch.Tensor | Sequence[int]) -> None:
        """Keep only ``rows`` (finished requests leave the batch)."""
        idx = torch.as_tensor(rows, dtype=torch.long, device=self.device)
        if self.slots > 0:
            self.cache.batch_select_indices(idx)
        self.mask = self.mask[idx]
        self.lengths = self.lengths[idx]
        self.has_holes = not bool(self.mask.all()) if self.slots else False
