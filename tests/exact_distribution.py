"""Exact-distribution helpers shared by the sampling tests of every method.

A tiny model's vocabulary is small enough to enumerate every continuation, so the target's
joint distribution of the first K tokens is computed exactly and sampled counts are compared
with it by Pearson's chi-square test.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

from specstudy.engine.sampling import logits_to_probs
from specstudy.records import Sampling


def exact_joint(model, sampling: Sampling, vocab: int, k: int, prompt: Sequence[int]) -> torch.Tensor:
    """P(t_1..t_k | prompt) for every sequence (in itertools.product order), by one forward over
    all vocab^k continuations."""
    seqs = torch.tensor(list(itertools.product(range(vocab), repeat=k)))
    ids = torch.cat([torch.tensor(list(prompt)).expand(len(seqs), -1), seqs], dim=1)
    with torch.no_grad():
        logits = model(ids).logits[:, len(prompt) - 1 : len(prompt) - 1 + k]
    probs = logits_to_probs(logits, sampling.temperature, sampling.top_k, sampling.top_p)
    return probs.gather(2, seqs[..., None]).squeeze(2).prod(dim=1)


def chi_square_p(counts: torch.Tensor, expected: torch.Tensor) -> float:
    """Upper-tail p-value of Pearson's statistic (cells with expected < 5 pooled into one)."""
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]]).double()
    exp = torch.cat([expected[big], expected[~big].sum()[None]]).double()
    keep = exp > 0
    stat = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))
