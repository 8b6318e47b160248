"""``dflash`` — a DFlash block drafter (:mod:`specstudy.engine.dflash_drafter`): γ drafts in one forward.

Per step, as vLLM's ``DFlashProposer`` does:

1. the target features the last target pass produced (the prompt's after prefill; the pending
   token's and the accepted drafts' after a verification) become context keys and values in each
   drafter layer (kept: a position's context never changes once verified);
2. one drafter forward over the block ``[last committed token, mask × γ]`` at positions
   n .. n + γ, attending to all the context and the whole block, gives the γ drafts at once —
   the argmax of each mask slot, or a draw from its sampling distribution q (each slot's own,
   which is all exact rejection sampling needs);
3. the chain goes through the shared loop and verify step
   (:func:`specstudy.engine.speculate.speculative_decode`), any batch size; nothing rolls back,
   since the block's own keys are never kept.

``drafter``: a folder from ``specstudy train-drafter --kind dflash`` — the files vLLM's ``dflash``
method loads as they are.  γ ≤ the folder's ``block_size`` − 1.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...synthetic import parse_synthetic
from ..dflash_drafter import DFlashDraft, load_dflash, read_dflash_config
from ..sampling import probs_for
from ..speculate import Draft
from ..trace import RowTrace
from . import SYNTHETIC, DecodeJob, EngineMethod, chain_decode, job_drafter
from .eagle3 import resolve_folder
from .heads import AuxCapture

#: what a study is checked against, read as a literal (no import, no torch) by
#: specstudy.frameworks.reference; SPEC below is built from it
HEADER = {
    "name": "dflash",
    "family": "heads",
    "order": 78,
    "needs_drafter": True,
    "uses_gamma": True,
    "max_batch": None,
    "options": ("synthetic_acceptance",),
    "block": True,
}

KV = tuple[torch.Tensor, torch.Tensor]


class DFlashDrafter:
    """The :class:`~specstudy.engine.speculate.Drafter` of ``dflash``.  ``ctx[b][l]``: layer l's
    context keys/values of row b's verified positions 0 .. n−1; ``known[b]``: target features of
    the positions after them not yet turned into context."""

    def __init__(
        self,
        target: Any,
        draft: DFlashDraft,
        capture: AuxCapture,
        batch_size: int,
        gamma: int,
        sampling: Any,
        generator: torch.Generator | None,
    ):
        self.target, self.draft, self.capture, self.gamma = target, draft, capture, gamma
        self.sampling, self.generator = sampling, generator
        empty = [(torch.empty(0), torch.empty(0)) for _ in draft.layers]
        self.ctx: list[list[KV]] = [list(empty) for _ in range(batch_size)]
        self.known: list[torch.Tensor] = []

    def _features(self) -> torch.Tensor:
        last = self.capture.last
        if last is None:
            raise RuntimeError("dflash: the target pass captured no features (its hooks did not run)")
        return last

    def prefill(self, prompts: list[list[int]]) -> None:
        last = self._features()
        w = last.shape[1]
        self.known = [last[b, w - len(p) :] for b, p in enumerate(prompts)]

    def _absorb(self) -> None:
        for b, feats in enumerate(self.known):
            n = self.length(b)
            pos = torch.arange(n, n + len(feats), device=feats.device)[None]
            new = self.draft.context_kv(feats[None], pos)
            self.ctx[b] = [
                (k[0], v[0]) if not len(old_k) else (torch.cat([old_k, k[0]]), torch.cat([old_v, v[0]]))
                for (old_k, old_v), (k, v) in zip(self.ctx[b], new)
            ]
        self.known = []

    def length(self, b: int) -> int:
        return len(self.ctx[b][0][0])

    @torch.no_grad()
    def propose(self, contexts: list[list[int]], max_draft: list[int]) -> Draft:
        self._absorb()
        # always γ mask slots, as vLLM (the block attends both ways: a shorter one would draft
        # other tokens near max_tokens); rows then keep their max_draft[b] first drafts
        g, rows = max(self.gamma, *max_draft), len(contexts)
        lengths = [self.length(b) for b in range(rows)]
        for b, (c, n) in enumerate(zip(contexts, lengths)):
            if n != len(c) - 1:
                raise RuntimeError(f"dflash row {b}: {n} context features for {len(c)} committed tokens")
        dev = self.ctx[0][0][0].device
        width = max(lengths)
        ctx, allowed = self._padded(lengths, width, g, dev)
        ids = torch.tensor([[c[-1]] + [self.draft.mask_token_id] * g for c in contexts], device=dev)
        pos = torch.tensor(lengths, device=dev)[:, None] + torch.arange(g + 1, device=dev)
        emb = self.target.get_input_embeddings()(ids)
        out = self.draft(emb, pos, ctx, allowed)[:, 1:]
        logits = self.target.get_output_embeddings()(out.to(emb.dtype))
        n_draft, w = torch.as_tensor(max_draft, device=dev), max(max_draft)
        if self.sampling.greedy:
            return Draft(logits.argmax(-1)[:, :w], n_draft)
        q = probs_for(logits, self.sampling)[:, :w]
        tokens = torch.multinomial(q.reshape(-1, q.shape[-1]), 1, generator=self.generator).view(rows, w)
        return Draft(tokens, n_draft, q)

    def _padded(self, lengths: list[int], width: int, g: int, dev: Any) -> tuple[list[KV], torch.Tensor]:
        """Each layer's context keys/values left-padded to ``width``; the mask of what each block
        slot sees (its row's context and the whole block)."""
        out = []
        for layer in range(len(self.draft.layers)):
            ks, vs = [], []
            for b, n in enumerate(lengths):
                k, v = self.ctx[b][layer]
                pad = k.new_zeros((width - n, *k.shape[1:]))
                ks.append(torch.cat([pad, k]))
                vs.append(torch.cat([pad, v]))
            out.append((torch.stack(ks), torch.stack(vs)))
        seen = torch.arange(width, device=dev)[None] >= (width - torch.tensor(lengths, device=dev))[:, None]
        allowed = torch.cat([seen, torch.ones(len(lengths), g + 1, dtype=torch.bool, device=dev)], dim=1)
        return out, allowed[:, None].expand(-1, g + 1, -1)

    def accepted(self, n_accepted: torch.Tensor, draft: Draft) -> None:
        # the verification pass ([pending, d_1..d_n], right-padded) gave the true features of the
        # pending token and the accepted drafts
        last = self._features()
        self.known = [last[b, : int(a) + 1] for b, a in enumerate(n_accepted.tolist())]

    def select_rows(self, keep: list[int]) -> None:
        self.ctx = [self.ctx[i] for i in keep]
        if self.known:
            self.known = [self.known[i] for i in keep]


def load(name: str, target: Any, device: str = "cpu", dtype: str = "float32") -> DFlashDraft:
    """cell.drafter (a DFlash folder) → the drafter, in the target's dtype and on its device."""
    draft = load_dflash(resolve_folder(name), target.config)
    return draft.to(device=device, dtype=next(target.parameters()).dtype)


def decode(job: DecodeJob) -> list[RowTrace]:
    draft = job_drafter(job, DFlashDraft, "dflash")
    if job.draft_length > draft.block_size - 1:
        raise ValueError(f"method 'dflash': gamma={job.draft_length} exceeds the block's {draft.block_size - 1}")
    gen = job.generator()
    with AuxCapture(job.target, draft.aux_streams) as capture:
        drafter = DFlashDrafter(job.target, draft, capture, len(job.prompts), job.draft_length, job.sampling, gen)
        return chain_decode(job, drafter, gen)


@dataclass(frozen=True)
class DFlashSpec(EngineMethod):
    """Checks that the drafter is a DFlash folder whose block holds γ, before any model is loaded."""

    def check(self, gamma: int | None, batch_size: int, drafter: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        out = EngineMethod.check(self, gamma, batch_size, drafter, options)
        block = drafter.block_size if isinstance(drafter, DFlashDraft) else None
        if block is None:
            cfg = read_dflash_config(resolve_folder(drafter))
            block = int(cfg.get("block_size") or (cfg.get("dflash_config") or {}).get("block_size") or 0)
        if gamma is not None and gamma > block - 1:
            raise ValueError(
                f"method 'dflash': gamma={gamma}: allowed <= {block - 1} (the drafter's block_size {block})"
            )
        return out


SPEC = DFlashSpec.from_header(
    HEADER,
    decode=decode,
    load_drafter=load,
    options={SYNTHETIC: parse_synthetic},
    description="DFlash block drafter (the target's low/middle/high layer outputs as context, a block of mask "
    "slots drafted in one forward); drafter: a DFlash folder as vLLM's dflash method loads it, from "
    "`specstudy train-drafter --kind dflash`",
)
