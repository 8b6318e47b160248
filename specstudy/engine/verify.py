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
Padding (positions at or beyond ``n_draft[b]``) may hold any value, even -1: both paths ignore it.

Synthetic acceptance (``synthetic=``, :mod:`specstudy.synthetic`): the number of drafts
kept comes from a fixed-rate rule instead of the test above; the next token is drawn as above
after that prefix.  Benchmark-only: the output is no longer the target's.
"""

from __future__ import annotations

from collections.abc import Callable
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
        raise ValueError(
            f"need draft_tokens [B, G] and target [B, G+1, V]; got {tuple(draft_tokens.shape)} "
            f"and {tuple(target.shape)}"
        )
    b, g = draft_tokens.shape
    if target.shape[0] != b or target.shape[1] != g + 1:
        raise ValueError(
            f"target shape {tuple(target.shape)} does not match draft_tokens {tuple(draft_tokens.shape)}: "
            f"need [{b}, {g + 1}, V]"
        )
    if n_draft.shape != (b,):
        raise ValueError(f"n_draft shape {tuple(n_draft.shape)}: need [{b}]")
    if n_draft.numel() and (int(n_draft.min()) < 0 or int(n_draft.max()) > g):
        raise ValueError(f"n_draft={n_draft.tolist()} must lie in [0, {g}]")


def accepted_prefix(accept: torch.Tensor, n_draft: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of accepted positions, capped by ``n_draft`` per row."""
    g = accept.shape[1]
    valid = torch.arange(g, device=accept.device)[None, :] < n_draft[:, None]
    return torch.cumprod((accept & valid).long(), dim=1).sum(dim=1)


def real_drafts(draft_tokens: torch.Tensor, n_draft: torch.Tensor) -> torch.Tensor:
    """``draft_tokens`` with every padded position (at or beyond ``n_draft[b]``) set to id 0, so
    any padding value, even one that is not a vocabulary id (-1), is safe to index with; what
    is read at a padded position never counts (:func:`accepted_prefix` stops at ``n_draft``)."""
    g = draft_tokens.shape[1]
    valid = torch.arange(g, device=draft_tokens.device)[None, :] < n_draft.to(draft_tokens.device)[:, None]
    return torch.where(valid, draft_tokens, torch.zeros_like(draft_tokens))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(p − q, 0)) over the last axis: what to sample after a draft from q was rejected.

    Where p == q up to rounding no mass is left; sampling from p is then the exact limit.
    """
    r = torch.clamp(p - q, min=0.0)
    mass = r.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, r / mass.clamp(min=torch.finfo(mass.dtype).tiny), p)


def verify_greedy(draft_tokens: torch.Tensor, n_draft: torch.Tensor, target_logits: torch.Tensor) -> VerifyOutcome:
    """Greedy verification: the longest prefix that equals the target's argmax, then its argmax."""
    _check_shapes(draft_tokens, n_draft, target_logits)
    best = greedy_tokens(target_logits)  # [B, G+1]
    n = accepted_prefix(draft_tokens == best[:, :-1], n_draft)
    return VerifyOutcome(accepted=n, next_token=best.gather(1, n[:, None]).squeeze(1))


def sampling_accepts(
    draft_tokens: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """``[B, G]`` bool: d_i accepted with probability min(1, p_i(d_i) / q_i(d_i)), i.e. iff
    u_i · q_i(d_i) < p_i(d_i) with u_i ~ U(0, 1) (no division by q).  ``draft_tokens`` must be
    valid ids everywhere (:func:`real_drafts`); ``draft_probs=None``: q one-hot on d_i."""
    b, g = draft_tokens.shape
    p_d = target_probs[:, :g].gather(2, draft_tokens[..., None]).squeeze(2)  # p_i(d_i)
    if draft_probs is None:
        q_d = torch.ones_like(p_d)
    else:
        if draft_probs.shape[:2] != (b, g) or draft_probs.shape[2] != target_probs.shape[2]:
            raise ValueError(f"draft_probs shape {tuple(draft_probs.shape)}: need [{b}, {g}, {target_probs.shape[2]}]")
        q_d = draft_probs.gather(2, draft_tokens[..., None]).squeeze(2)
    u = torch.rand(p_d.shape, generator=generator, device=p_d.device, dtype=p_d.dtype)
    return u * q_d < p_d


def sample_after(
    n: torch.Tensor,
    draft_tokens: torch.Tensor,
    n_draft: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """The token after ``n[b]`` kept drafts: from residual(p_{n+1}, q_{n+1}) where d_{n+1} was
    rejected (n < n_draft), from p_{n+1} (the bonus) where every draft was kept."""
    b, g = draft_tokens.shape
    rows = torch.arange(b, device=draft_tokens.device)
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
    return sample_from(residual(p_n, q_n), generator)


def verify_sampling(
    draft_tokens: torch.Tensor,
    n_draft: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor | None,
    generator: torch.Generator | None = None,
) -> VerifyOutcome:
    """Exact speculative (rejection) sampling; ``draft_probs=None`` means one-hot drafts."""
    _check_shapes(draft_tokens, n_draft, target_probs)
    tokens = real_drafts(draft_tokens, n_draft)
    n = accepted_prefix(sampling_accepts(tokens, target_probs, draft_probs, generator), n_draft)
    return VerifyOutcome(accepted=n, next_token=sample_after(n, tokens, n_draft, target_probs, draft_probs, generator))


def verify_synthetic(
    draft_tokens: torch.Tensor,
    n_draft: torch.Tensor,
    target_logits: torch.Tensor,
    sampling: Sampling,
    kept: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> VerifyOutcome:
    """Synthetic acceptance (:mod:`specstudy.synthetic`): ``kept[b]`` drafts are kept
    whatever the target says; the next token is the target's own choice after them, drawn as
    :func:`verify_greedy` / :func:`verify_sampling` would draw it after that prefix."""
    _check_shapes(draft_tokens, n_draft, target_logits)
    n = torch.minimum(kept.to(n_draft.device), n_draft)
    if sampling.greedy:
        return VerifyOutcome(accepted=n, next_token=greedy_tokens(target_logits).gather(1, n[:, None]).squeeze(1))
    tokens = real_drafts(draft_tokens, n_draft)
    probs = probs_for(target_logits, sampling)
    return VerifyOutcome(accepted=n, next_token=sample_after(n, tokens, n_draft, probs, draft_probs, generator))


def verify_step(
    draft_tokens: torch.Tensor,
    n_draft: torch.Tensor,
    target_logits: torch.Tensor,
    sampling: Sampling,
    draft_probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    synthetic: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> VerifyOutcome:
    """Verify a chain of drafts against the target's raw logits under ``sampling``.

    ``draft_probs`` must come from :func:`specstudy.engine.sampling.probs_for` with the same
    ``sampling`` (ignored when greedy).  ``synthetic``: ``n_draft -> drafts kept``
    (:meth:`specstudy.synthetic.SyntheticAcceptance.draws`) replaces the acceptance test.
    """
    if synthetic is not None:
        return verify_synthetic(
            draft_tokens, n_draft, target_logits, sampling, synthetic(n_draft), draft_probs, generator
        )
    if sampling.greedy:
        return verify_greedy(draft_tokens, n_draft, target_logits)
    return verify_sampling(draft_tokens, n_draft, probs_for(target_logits, sampling), draft_probs, generator)
