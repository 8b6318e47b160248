"""Distillation losses: the drafter against the target's distribution and its last hidden state."""

from __future__ import annotations

import torch
from torch import nn


def distill_loss(logits: torch.Tensor, label_ids: torch.Tensor, label_probs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the drafter against the target's (top-k, renormalised) distribution."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(label_probs * logp.gather(-1, label_ids)).sum(-1).mean()


def candidate_distill_loss(
    vectors: torch.Tensor, lm_head: nn.Linear, label_ids: torch.Tensor, label_probs: torch.Tensor
) -> torch.Tensor:
    """:func:`distill_loss` with the softmax restricted to the tokens labelled anywhere in the batch.

    The full LM head (49k × 576 for SmolLM2) would make every CPU step cost several GFLOP per
    head; the batch's labelled tokens (a few thousand) carry nearly all of the target's mass.
    """
    cand, inverse = torch.unique(label_ids, return_inverse=True)
    logits = vectors @ lm_head.weight[cand].T
    if getattr(lm_head, "bias", None) is not None:
        logits = logits + lm_head.bias[cand]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(label_probs * logp.gather(-1, inverse)).sum(-1).mean()


def regression_loss(vectors: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error to the target's own hidden state, relative to its mean square (EAGLE-style
    feature regression: keeps the drafter's vector where the LM head reads the right token)."""
    return ((vectors - target) ** 2).mean() / (target**2).mean().clamp(min=1e-12)
