"""Logits → token probabilities, one transform for the draft and the target.

Speculative sampling is lossless only when the draft distribution q and the target
distribution p are both produced by *the same* transform (temperature, then top-k, then top-p)
of their models' logits: the verify step then reproduces exactly the tokens that sampling from
the transformed target distribution would.  Every method calls :func:`logits_to_probs` for both
sides; greedy decoding (temperature 0) is argmax and never builds probabilities.

All functions work on any leading shape ``[..., V]`` and keep the logits' device.
"""

from __future__ import annotations

import torch

from ..records import Sampling


def _prob_dtype(logits: torch.Tensor) -> torch.dtype:
    """float64 stays float64 (exact tests); everything else is computed in float32."""
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def apply_top_k(logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """Keep the ``top_k`` largest logits (ties at the threshold kept), others → −inf.  0 = off."""
    if top_k <= 0 or top_k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest prefix of tokens (by descending probability) whose mass
    reaches ``top_p``; the token that crosses the threshold is kept.  1.0 = off."""
    if top_p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits.to(_prob_dtype(logits)), dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs  # mass of strictly better tokens
    drop_sorted = mass_before >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def logits_to_probs(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """The sampling distribution: softmax(filter(logits / T)).  Requires T > 0 (greedy is argmax)."""
    if temperature <= 0:
        raise ValueError(f"temperature={temperature!r}: logits_to_probs needs T > 0; use greedy_tokens for T = 0")
    x = logits.to(_prob_dtype(logits)) / temperature
    x = apply_top_k(x, top_k)
    x = apply_top_p(x, top_p)
    return torch.softmax(x, dim=-1)


def probs_for(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """:func:`logits_to_probs` with a :class:`Sampling`'s settings."""
    return logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Argmax over the vocabulary (ties → lowest id, deterministic)."""
    return torch.argmax(logits, dim=-1)


def sample_from(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token id per distribution in ``probs [..., V]`` → ``[...]``."""
    flat = probs.reshape(-1, probs.shape[-1])
    ids = torch.multinomial(flat, 1, generator=generator).squeeze(-1)
    return ids.reshape(probs.shape[:-1])


def next_tokens(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None = None) -> torch.Tensor:
    """The next token for each row of ``logits [..., V]``: argmax when greedy, else a sample."""
    if sampling.greedy:
        return greedy_tokens(logits)
    return sample_from(probs_for(logits, sampling), generator)


def make_generator(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A seeded generator on ``device``: one per decode call makes runs reproducible."""
    g = torch.Generator(device=device)
    g.manual_seed(int(seed))
    return g
