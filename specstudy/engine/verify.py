"""THE verify step: one target pass checks a chain of drafted tokens (Leviathan et al. 2023,
Chen et al. 2023).  Every chain method (draft_target, ngram, layer_skip, heads in linear mode)
calls :func:`verify_step`; nothing else decides acceptance.

Shapes, batched over rows b (ragged drafts are right-padded):

* ``draft_tokens [B, G]``  — drafted ids d_1..d_G (padding beyond ``n_draft[b]`` is ignored)
* ``n_draft [B]``          — how many drafts row b really has (0..G)
* ``target_logits [B, G+1, V]`` — the target's logits at the pending token and after each
  draft: row i predicts position i+1, so ``target_logits[:, i]`` scores d_{i+1} and
  ``target_logits[:, n_draft]`` is the bonus distribution.
* ``draft_probs [B, G, V]`` — q(· | prefix, d_<i) after the shared sampling transform, or
  ``None`` for a deterministic drafter (n-gram lookup, greedy heads): q is then one-hot on d_i.

Sampling (T > 0), per row, positions i = 1..n_draft in order:
    accept d_i with probability min(1, p_i(d_i) / q_i(d_i));
    at the first rejection emit a token from norm(max(p_i − q_i, 0)) and stop;
    if all n_draft are accepted emit a bonus token from p_{n_draft+1}.
The emitted tokens are distributed exactly as sampling from p token by token.
Greedy (T = 0): accept while d_i == argmax p_i; then emit argmax at the first mismatch (or
the bonus position) — identical to plain greedy decoding of the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..records import Sampling
from .sampling import greedy_tokens, probs_for, sample_from


@dataclass
class VerifyOutcome:
    """Per row: ``accepted[b]`` drafts accepted (0..n_draft[b]) and the ``next_token[b]`` that
    follows them (the corrected token after a rejection, else the bonus token)."""

    accepted: torch.Tensor  # [B] long
    next_token: torch.Tensor  # [B] long

    def emitted(self, draft_tokens: torch.Tensor) -> list[list[int]]:
        """The tokens each row emits this step: its accepted drafts, then ``next_token``."""
        acc = self.accepted.tolist()
        nxt = self.next_token.tolist()
        drafts = draft_tokens.tolist()
        return [drafts[b][: acc[b]] + [nxt[b]] for b in range(len(acc))]


def _check_shapes(draft_tokens: torch.Tensor, n_draft: torch.Tensor, target: torch.Tensor) -> None:
    if draft_tokens.dim() != 2 or target.dim() != 3:
        raise ValueError(f"need draft_tokens [B, G] and target [B, G+1, V]; got {tuple(draft_tokens.shape)} "
                         f"and {tuple(target.shape)}")
    b, g = draft_tokens.shape
    if target.shape[0] != b or target.shape[1] != g + 1:
        raise ValueError(f"target shape {tuple(target.shape)} does not match draft_tokens {tuple(draft_tokens.shape)}: "
                         f"need [{b}, {g + 1}, V]")
    if n_draft.shape != (b,):
        raise ValueError(f"n_draft shape {tuple(n_draft.shape)}: need [{b}]")
    if n_draft.numel() and (int(n_draft.min()) < 0 or int(n_draft.max()) > g):
        raise ValueError(f"n_draft={n_draft.tolist()} must lie in [0, {g}]")


def accepted_prefix(accept: torch.Tensor, n_draft: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of accepted positions, capped by ``n_draft`` per row."""
    g = accept.shape[1]
    valid = torch.arange(g, device=accept.device)[None, :] < n_draft[:, None]
    return torch.cumprod((accept & valid).long(), dim=1).sum(dim=1)


def verify_greedy(draft_tokens: torch.Tensor, n_draft: torch.Tensor, target_logits: torch.Tensor) -> VerifyOutcome:
    """Greedy verification: the longest prefix that equals the target's argmax, then its argmax."""
    _check_shapes(draft_tokens, n_draft, target_logits)
    best = greedy_tokens(target_logits)  # [B, G+1]
    n = accepted_prefix(draft_tokens == best[:, :-1], n_draft)
    return VerifyOutcome(accepted=n, next_token=best.gather(1, n[:, None]).squeeze(1))


def verify_sampling(
    draft_tokens: torch.Tensor,
    n_draft: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> VerifyOutcome:
    """Exact speculative (rejection) sampling; ``draft_probs=None`` means one-hot drafts."""
    _check_shapes(draft_tokens, n_draft, target_probs)
    b, g = draft_tokens.shape
    rows = torch.arange(b, device=draft_tokens.device)
    p_d = target_probs[:, :g].gather(2, draft_tokens[..., None]).squeeze(2)  # p_i(d_i)
    if draft_probs is None:
        q_d = torch.ones_like(p_d)
    else:
        if draft_probs.shape[:2] != (b, g) or draft_probs.shape[2] != target_probs.shape[2]:
            raise ValueError(f"draft_probs shape {tuple(draft_probs.shape)}: need [{b}, {g}, {target_probs.shape[2]}]")
        q_d = draft_probs.gather(2, draft_tokens[..., None]).squeeze(2)
    u = torch.rand(p_d.shape, generator=generator, device=p_d.device, dtype=p_d.dtype)
    accept = u * q_d < p_d  # u < min(1, p/q) without dividing by q
    n = accepted_prefix(accept, n_draft)

    # the distribution of the token after the accepted prefix
    p_n = target_probs[rows, n]  # [B, V]
    rejected = n < n_draft
    q_n = torch.zeros_like(p_n)
    if rejected.any():
        pos = n.clamp(max=g - 1)
        if draft_probs is None:
            q_n[rows, draft_tokens[rows, pos]] = 1.0
        else:
            q_n = draft_probs[rows, pos]
        q_n = q_n * rejected[:, None]
    residual = torch.clamp(p_n - q_n, min=0.0)
    mass = residual.sum(dim=1, keepdim=True)
    # p == q up to rounding leaves no residual mass: sampling from p is then the exact limit
    residual = torch.where(mass > 0, residual / mass.clamp(min=torch.finfo(mass.dtype).tiny), p_n)
    return VerifyOutcome(accepted=n, next_token=sample_from(residual, generator))


def verify_step(
    draft_tokens: torch.Tensor,
    n_draft: torch.Tensor,
    target_logits: torch.Tensor,
    sampling: Sampling,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> VerifyOutcome:
    """Verify a chain of drafts against the target's raw logits under ``sampling``.

    ``draft_probs`` must come from :func:`specstudy.engine.sampling.probs_for` with the same
    ``sampling`` (ignored when greedy).
    """
    if sampling.greedy:
        return verify_greedy(draft_tokens, n_draft, target_logits)
    return verify_sampling(draft_tokens, n_draft, probs_for(target_logits, sampling), draft_probs, generator)
