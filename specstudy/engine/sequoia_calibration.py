"""Sequoia's inputs, measured here: the acceptance vector and the verification-cost curve.

* acceptance vector ``a[k-1]``: how often the drafter's rank-k child is the accepted one.  The
  target and the drafter each read the calibration prompt once (teacher-forced, one causal
  forward each); at every position, greedy: the share of positions where the target's argmax is
  the drafter's k-th most likely token; sampling: the share of trials where the k-th of K draws
  without replacement from q passes the sibling test of
  :func:`specstudy.engine.proposals.accept_proposals` (the rule the method verifies with).
* cost curve ``T(n)/T(1)``: one target forward over n new tokens on the cached prompt, median
  of a few (:func:`specstudy.engine.stepcost.measure_verify_time`; a causal block stands in for
  the n-node tree, same width); and c = T_draft(1)/T_target(1)
  (:func:`specstudy.engine.stepcost.draft_cost_ratio`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .kv import new_cache
from .methods.tree import lm_forward, sibling_step
from .sampling import probs_for
from .stepcost import draft_cost_ratio, measure_verify_time
from .tokentree import causal_forward

#: positions of the calibration prompt used at most (its last ones)
MAX_POSITIONS = 96
#: trials per position under sampling
TRIALS = 4


def draws_without_replacement(
    q: torch.Tensor, k: int, generator: torch.Generator | None
) -> list[tuple[int, torch.Tensor]]:
    """Up to k draws from q without replacement, each with the distribution it was drawn
    from: q, then q with the earlier draws removed and renormalised."""
    out: list[tuple[int, torch.Tensor]] = []
    cur = q
    for _ in range(min(k, int((q > 0).sum()))):
        tok = int(torch.multinomial(cur, 1, generator=generator))
        out.append((tok, cur))
        rest = cur.clone()
        rest[tok] = 0.0
        mass = rest.sum()
        if mass <= 0:
            break
        cur = rest / mass
    return out


def _rank_counts_greedy(p_logits: torch.Tensor, q_logits: torch.Tensor, k: int) -> torch.Tensor:
    best = p_logits.argmax(dim=-1)  # [L]
    top = torch.topk(q_logits, k, dim=-1).indices  # [L, k]
    return (top == best[:, None]).double().sum(dim=0)


def _rank_counts_sampling(
    p_logits: torch.Tensor, q_logits: torch.Tensor, k: int, sampling: Any, generator: torch.Generator | None
) -> torch.Tensor:
    counts = torch.zeros(k, dtype=torch.float64)
    p_all, q_all = probs_for(p_logits, sampling), probs_for(q_logits, sampling)
    for pos in range(p_all.shape[0]):
        for _ in range(TRIALS):
            p = p_all[pos]
            for rank, (tok, q) in enumerate(draws_without_replacement(q_all[pos], k, generator)):
                ok, p = sibling_step(p, q, tok, generator)
                if ok:
                    counts[rank] += 1
                    break
    return counts / TRIALS


@torch.no_grad()
def acceptance_vector(
    target: Any, drafter: Any, prompt: Sequence[int], k: int, sampling: Any, generator: torch.Generator | None
) -> list[float]:
    """``a[r]``: the share of calibration positions whose accepted child is the rank-(r+1) one."""
    if len(prompt) < 2:
        raise ValueError("the calibration prompt needs at least 2 tokens")
    _, p_logits = causal_forward(target, new_cache(target), 0, prompt)
    q_logits = lm_forward(drafter, new_cache(drafter), 0, prompt)
    p_logits, q_logits = p_logits[-MAX_POSITIONS:].float(), q_logits[-MAX_POSITIONS:].float().to(p_logits.device)
    k = min(k, q_logits.shape[-1])
    if sampling.greedy:
        counts = _rank_counts_greedy(p_logits, q_logits, k)
    else:
        counts = _rank_counts_sampling(p_logits.cpu(), q_logits.cpu(), k, sampling, generator)
    return [float(c) / p_logits.shape[0] for c in counts]


def cost_points(max_nodes: int) -> list[int]:
    """Widths to time: 1, 2, 3, 4, then about two per doubling, and max_nodes itself."""
    pts = {1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, max_nodes}
    return sorted(p for p in pts if p <= max_nodes)


def cost_curve(target: Any, prompt: Sequence[int], max_nodes: int, device: Any, repeats: int = 5) -> dict[int, float]:
    """``{n: T(n)/T(1)}`` at :func:`cost_points`, measured on this machine now."""
    times = measure_verify_time(target, prompt, cost_points(max_nodes), repeats, 1, device)
    return {n: t / times[1] for n, t in times.items()}


def draft_cost(drafter: Any, target: Any, prompt: Sequence[int], device: Any) -> float:
    """c = T_draft(1)/T_target(1), measured (cached per model in this process)."""
    return float(draft_cost_ratio(drafter, target, prompt, 1, device))
