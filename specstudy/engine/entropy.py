"""Per-token entropy of the target's next-token distribution, from logits already computed.

Acceptance depends on how peaked the target is: a low-entropy continuation (boilerplate code,
copying) is easy to draft, a high-entropy one (creative writing) is not.  The reference engine
scores every emitted token with the logits of the verification pass that produced it, so the
measurement costs no extra forward.  Entropy is of the model's own (untempered, unfiltered)
distribution, in nats.
"""

from __future__ import annotations

import torch


def log_probs(logits: torch.Tensor) -> torch.Tensor:
    """log softmax over the last axis, in float32 (float64 kept)."""
    dt = torch.float64 if logits.dtype == torch.float64 else torch.float32
    return torch.log_softmax(logits.to(dt), dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H(p) = −Σ p log p (nats) of softmax(logits), over the last axis: ``[..., V] → [...]``."""
    lp = log_probs(logits)
    p = lp.exp()
    # p log p is 0 where p == 0 (lp = −inf would give nan)
    return -(p * lp.masked_fill(p == 0, 0.0)).sum(dim=-1)


def token_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """log p(token) under softmax(logits): ``logits [..., V]``, ``token_ids [...]`` → ``[...]``."""
    return log_probs(logits).gather(-1, token_ids[..., None].to(logits.device)).squeeze(-1)


def entropy_and_logprobs(logits: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both at once from one log-softmax (the engine's per-step call)."""
    lp = log_probs(logits)
    p = lp.exp()
    ent = -(p * lp.masked_fill(p == 0, 0.0)).sum(dim=-1)
    return ent, lp.gather(-1, token_ids[..., None].to(logits.device)).squeeze(-1)


def summarize_entropy(values: list[float]) -> dict[str, float]:
    """Mean, median and p90 of per-token entropies (NaN when empty), for per-task summaries."""
    import numpy as np

    v = np.asarray([x for x in values if x == x], dtype=float)
    if v.size == 0:
        nan = float("nan")
        return {"mean": nan, "median": nan, "p90": nan, "n": 0.0}
    return {
        "mean": float(v.mean()),
        "median": float(np.median(v)),
        "p90": float(np.percentile(v, 90)),
        "n": float(v.size),
    }
