"""The chain speculative loop shared by draft_target, ngram and layer_skip (gpt-fast style).

Per verification step, for every active row:

1. the drafter proposes up to γ tokens after the row's context;
2. the target runs once over ``[pending, d_1..d_n]`` (the pending token is the last emitted
   one, not yet in the target's cache);
3. :func:`specstudy.engine.verify.verify_step` accepts a prefix and picks the next token (or,
   with ``synthetic`` acceptance, a fixed-rate rule keeps the prefix: :mod:`.synthetic`);
4. both caches roll back the rejected drafts; the accepted drafts and the next token are
   emitted (the next token becomes the new pending one).

The prompt's prefill is a step of its own (it emits the first token, drafted = 0), so
tokens per target forward = emitted tokens / steps counts every target forward.  With
``draft_in_prefill`` the first step drafts from the prompt and the prompt pass verifies those
drafts as well.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ..costmodel import optimal_gamma
from ..metrics import alpha_hat
from ..records import Sampling
from ..synthetic import SyntheticAcceptance
from .kv import KVState, pad_ragged
from .sampling import next_tokens, probs_for
from .trace import BatchTrace, RowTrace, Timer
from .verify import VerifyOutcome, verify_step


@dataclass
class Draft:
    """A batch of drafted chains: ``tokens [B, G]`` (row b real up to ``n_draft[b]``) and the
    draft distributions ``probs [B, G, V]`` they were sampled from (None: deterministic)."""

    tokens: torch.Tensor
    n_draft: torch.Tensor
    probs: torch.Tensor | None = None


class Drafter(Protocol):
    """What the chain loop needs from a drafter.  It may also define ``prefill(prompts)``, called
    once after the target's prefill and timed as that step's ``draft_s``."""

    def propose(self, contexts: list[list[int]], max_draft: list[int]) -> Draft:
        """Draft up to ``max_draft[b]`` tokens after ``contexts[b]`` (prompt + emitted)."""

    def accepted(self, n_accepted: torch.Tensor, draft: Draft) -> None:
        """The target accepted ``n_accepted[b]`` drafts of row b: roll back the rest."""

    def select_rows(self, keep: list[int]) -> None:
        """Only rows ``keep`` (positions in the current batch) go on."""


#: ``verify(draft, target_logits [B, G+1, V]) -> VerifyOutcome``: the step's acceptance decision
Verify = Callable[[Draft, torch.Tensor], VerifyOutcome]


def make_verify(
    sampling: Sampling, generator: torch.Generator | None, synthetic: SyntheticAcceptance | None = None
) -> Verify:
    """The loop's verify step: :func:`~specstudy.engine.verify.verify_step` under ``sampling``,
    with the synthetic rule's own seeded draws when ``synthetic`` is set."""
    draws = synthetic.draws(sampling.seed) if synthetic is not None else None

    def verify(draft: Draft, logits: torch.Tensor) -> VerifyOutcome:
        return verify_step(
            draft.tokens, draft.n_draft.to(logits.device), logits, sampling, draft.probs, generator, draws
        )

    return verify


def empty_draft(batch: int, device: torch.device) -> Draft:
    return Draft(
        torch.zeros((batch, 0), dtype=torch.long, device=device), torch.zeros(batch, dtype=torch.long, device=device)
    )


# --------------------------------------------------------------------------------------------
# γ policies


class StaticGamma:
    """The same γ every step."""

    def __init__(self, gamma: int):
        self.gamma = gamma

    def gammas(self, rows: Sequence[int]) -> list[int]:
        return [self.gamma] * len(rows)

    def update(self, rows: Sequence[int], drafted: Sequence[int], accepted: Sequence[int]) -> None:
        pass


class HeuristicGamma:
    """Per-row dynamic γ (the rule of HF's "heuristic" schedule): +2 after a step whose drafts
    were all accepted, −1 (not below 1) otherwise, capped at ``gamma_max``."""

    def __init__(self, gamma: int, gamma_max: int):
        self.start, self.gamma_max = gamma, gamma_max
        self.current: dict[int, int] = {}

    def gammas(self, rows: Sequence[int]) -> list[int]:
        return [self.current.get(r, self.start) for r in rows]

    def update(self, rows: Sequence[int], drafted: Sequence[int], accepted: Sequence[int]) -> None:
        for r, d, a in zip(rows, drafted, accepted):
            if d == 0:
                continue
            g = self.current.get(r, self.start)
            self.current[r] = min(g + 2, self.gamma_max) if a == d else max(1, g - 1)


class CostAwareGamma:
    """Per row and step, the draft length the cost model says pays most.

    γ* = argmax over 1..``gamma_max`` of AL(α̂, γ) / (γ·c + T(γ+1)/T(1))
    (:func:`specstudy.costmodel.optimal_gamma`), where α̂ is the row's acceptance so far
    (:func:`specstudy.metrics.alpha_hat` with a Beta(1, 1) prior, so 0.5 before any draft) and
    T(k)/T(1) the target's measured verification-cost curve (:mod:`.stepcost`).  It pays where
    verifying more tokens costs more (CPUs: the curve jumps between k = 3 and k = 4 here) and
    reduces to γ = ``gamma_max`` where verification is flat and acceptance high.
    """

    def __init__(self, gamma_max: int, verify_ratio: Sequence[float], c: float = 0.0):
        if len(verify_ratio) < gamma_max + 1:
            raise ValueError(f"verify_ratio has {len(verify_ratio)} entries; need gamma_max + 1 = {gamma_max + 1}")
        self.gamma_max, self.verify_ratio, self.c = gamma_max, list(verify_ratio), c
        self.accepted_at: dict[int, list[int]] = {}
        self.drafted_at: dict[int, list[int]] = {}

    def alpha(self, row: int) -> float:
        return alpha_hat(self.accepted_at.get(row, []), self.drafted_at.get(row, []), prior=(1.0, 1.0))

    def gammas(self, rows: Sequence[int]) -> list[int]:
        return [optimal_gamma(self.alpha(r), self.c, self.gamma_max, self.verify_ratio)[0] for r in rows]

    def update(self, rows: Sequence[int], drafted: Sequence[int], accepted: Sequence[int]) -> None:
        for r, d, a in zip(rows, drafted, accepted):
            acc = self.accepted_at.setdefault(r, [0] * self.gamma_max)
            dr = self.drafted_at.setdefault(r, [0] * self.gamma_max)
            for i in range(min(d, self.gamma_max)):
                dr[i] += 1
                acc[i] += i < a


# --------------------------------------------------------------------------------------------
# the loop


def prefill(state: KVState, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
    """Run the prompts (left-padded) through ``state``; returns the last position's logits [B, V]."""
    ids, valid = pad_ragged(prompts, "left", device=state.device)
    return state.forward(ids, valid, logits_to_keep=1)[:, -1]


def speculative_decode(
    target: torch.nn.Module,
    drafter: Drafter,
    prompts: Sequence[Sequence[int]],
    sampling: Sampling,
    gamma_policy: StaticGamma | HeuristicGamma | CostAwareGamma,
    generator: torch.Generator | None,
    eos_token_ids: Sequence[int] = (),
    device: str | torch.device = "cpu",
    draft_in_prefill: bool = False,
    synthetic: SyntheticAcceptance | None = None,
) -> list[RowTrace]:
    """Decode ``prompts`` with the chain loop; one :class:`RowTrace` per prompt.

    ``draft_in_prefill``: the first step drafts from the prompt and the target's prompt pass
    verifies those drafts too (HF assisted generation's first step), which saves one target
    forward per request; the first step then emits up to γ + 1 tokens, so TTFT includes drafting.
    Off (the default), the prompt pass is a step of its own that emits one token, as in
    ``ar``.  Prompts of one token always take the separate prefill.
    ``synthetic``: keep drafts at a fixed rate instead of verifying them (benchmark-only,
    :mod:`specstudy.synthetic`); the target still runs over every real draft.
    """
    trace = BatchTrace(prompts, sampling.max_new_tokens, eos_token_ids, sampling.ignore_eos, device)
    tstate = KVState(target, len(prompts), device)
    verify = make_verify(sampling, generator, synthetic)

    prompt_ids = [trace.rows[i].prompt_ids for i in trace.active]
    if draft_in_prefill and min(len(p) for p in prompt_ids) >= 2:
        prefill_with_drafts(tstate, drafter, trace, gamma_policy, verify, device)
    else:
        with Timer(device) as tv:
            last = prefill(tstate, prompt_ids)
        draft_prefill = getattr(drafter, "prefill", None)
        with Timer(device) as td:  # the drafter's own prompt pass belongs to the prefill step, not to step 1
            if draft_prefill is not None:
                draft_prefill(prompt_ids)
        first = next_tokens(last, sampling, generator)
        keep = trace.emit(
            [[t] for t in first.tolist()], last[:, None], 0, 0, td.s if draft_prefill is not None else None, tv.s
        )
        _keep_rows(keep, tstate, drafter)

    while not trace.done:
        contexts = trace.contexts()
        rows = list(trace.active)
        with Timer(device) as td:
            draft, max_draft = _propose(drafter, contexts, trace, gamma_policy, tstate.device)
        n_draft = draft.n_draft.tolist()
        drafts = draft.tokens.tolist()
        block = [[c[-1]] + d[:n] for c, d, n in zip(contexts, drafts, n_draft)]
        ids, valid = pad_ragged(block, "right", width=draft.tokens.shape[1] + 1, device=tstate.device)
        with Timer(device) as tv:
            logits = tstate.forward(ids, valid)
        _verify_and_emit(tstate, drafter, trace, gamma_policy, rows, draft, max_draft, logits, verify, td.s, tv.s)
    return trace.rows


def prefill_with_drafts(
    tstate: KVState,
    drafter: Drafter,
    trace: BatchTrace,
    gamma_policy: StaticGamma | HeuristicGamma | CostAwareGamma,
    verify: Verify,
    device: str | torch.device,
) -> None:
    """The first step with drafts: the drafter reads the prompt and drafts after it, and one
    target pass over ``prompt + drafts`` (left-padded) both fills the cache and verifies them."""
    rows = list(trace.active)
    contexts = trace.contexts()
    draft_prefill = getattr(drafter, "prefill", None)
    with Timer(device) as td:
        if draft_prefill is not None:  # all but the last prompt token: propose feeds that one
            draft_prefill([c[:-1] for c in contexts])
        draft, max_draft = _propose(drafter, contexts, trace, gamma_policy, tstate.device)
    n_draft = draft.n_draft.to(tstate.device)
    width = draft.tokens.shape[1]
    blocks = [c + d[:n] for c, d, n in zip(contexts, draft.tokens.tolist(), n_draft.tolist())]
    ids, valid = pad_ragged(blocks, "left", device=tstate.device)
    with Timer(device) as tv:
        tail = tstate.forward(ids, valid, logits_to_keep=width + 1)  # [B, width + 1, V]
    # left padding ends every row in the last column: row b's last prompt token and its n_b
    # drafts are its last n_b + 1 columns; shift them to column 0 like a verification block
    cols = torch.arange(width + 1, device=tail.device)[None, :] + (width - n_draft.to(tail.device))[:, None]
    logits = tail.gather(1, cols.clamp(max=width)[:, :, None].expand(-1, -1, tail.shape[-1]))
    _verify_and_emit(tstate, drafter, trace, gamma_policy, rows, draft, max_draft, logits, verify, td.s, tv.s)


def _propose(
    drafter: Drafter,
    contexts: list[list[int]],
    trace: BatchTrace,
    gamma_policy: StaticGamma | HeuristicGamma | CostAwareGamma,
    device: torch.device,
) -> tuple[Draft, list[int]]:
    """The step's drafts, each row's at most its γ and its budget − 1 (the last token needs none)."""
    max_draft = [max(0, min(g, r - 1)) for g, r in zip(gamma_policy.gammas(list(trace.active)), trace.remaining())]
    if max(max_draft) > 0:
        return drafter.propose(contexts, max_draft), max_draft
    return empty_draft(len(contexts), device), max_draft


def _verify_and_emit(
    tstate: KVState,
    drafter: Drafter,
    trace: BatchTrace,
    gamma_policy: StaticGamma | HeuristicGamma | CostAwareGamma,
    rows: list[int],
    draft: Draft,
    max_draft: list[int],
    logits: torch.Tensor,
    verify: Verify,
    draft_s: float,
    verify_s: float,
) -> None:
    """Accept a prefix of each row's drafts, roll both caches back, emit and drop finished rows."""
    n_draft = draft.n_draft.tolist()
    outcome = verify(draft, logits)
    accepted = outcome.accepted.tolist()
    tstate.rollback([n - a for n, a in zip(n_draft, accepted)])
    if max(max_draft) > 0:
        drafter.accepted(outcome.accepted, draft)
    gamma_policy.update(rows, n_draft, accepted)
    keep = trace.emit(outcome.emitted(draft.tokens), logits, n_draft, accepted, draft_s, verify_s)
    _keep_rows(keep, tstate, drafter, before=len(rows))


def _keep_rows(keep: list[int], state: KVState, drafter: Drafter, before: int | None = None) -> None:
    n = state.batch_size if before is None else before
    if keep and len(keep) < n:
        state.select_rows(keep)
        drafter.select_rows(keep)


def sample_chain(
    logits: torch.Tensor,
    max_draft: list[int],
    sampling: Sampling,
    generator: torch.Generator | None,
    feed: Callable[[torch.Tensor], torch.Tensor],
    stop: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
) -> Draft:
    """Draft autoregressively: a token from ``logits [B, V]`` (argmax, or a sample of the shared
    sampling transform q, kept for rejection sampling), then ``feed(tokens) -> next logits``, up
    to ``max_draft[b]`` tokens per row.  ``stop(logits, tokens)`` ends rows early (the token is
    kept).  Every row is fed on every round, so a drafter's cache grows alike in all rows."""
    device = logits.device
    g = max(max_draft)
    limit = torch.as_tensor(max_draft, device=device)
    n_draft = torch.zeros_like(limit)
    running = limit > 0
    tokens, probs = [], []
    for i in range(g):
        if sampling.greedy:
            tok = torch.argmax(logits, dim=-1)
        else:
            q = probs_for(logits, sampling)
            tok = torch.multinomial(q, 1, generator=generator).squeeze(-1)
            probs.append(q)
        tokens.append(tok)
        n_draft = n_draft + running.long()
        running = running & (n_draft < limit)
        if stop is not None:
            running = running & ~stop(logits, tok)
        if i == g - 1 or not bool(running.any()):
            break
        logits = feed(tok)
    return Draft(torch.stack(tokens, dim=1), n_draft, torch.stack(probs, dim=1) if probs else None)


# --------------------------------------------------------------------------------------------
# a drafter that is a causal LM (a draft model, or the target's first layers)


class ModelDrafter:
    """Drafts with a causal LM that has its own KV cache.

    Its cache holds a prefix of each row's context (the prompt after :meth:`prefill`);
    :meth:`propose` first feeds the tokens it has not seen (the pending token, plus the last
    draft when all were accepted), then samples γ tokens one by one with the shared sampling
    transform.
    ``confidence``: a row stops drafting after a token whose draft probability (untempered) is
    below it (the dynamic-γ "confidence" policy); the first draft is always proposed.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        batch_size: int,
        sampling: Sampling,
        generator: torch.Generator | None,
        device: str | torch.device = "cpu",
        confidence: float | None = None,
    ):
        self.state = KVState(model, batch_size, device)
        self.sampling = sampling
        self.generator = generator
        self.confidence = confidence
        self._fed = 0  # draft tokens fed into the cache in the last propose

    def prefill(self, prompts: Sequence[Sequence[int]]) -> None:
        """Run the prompts through the draft model before the first step."""
        prefill(self.state, prompts)

    def propose(self, contexts: list[list[int]], max_draft: list[int]) -> Draft:
        lengths = self.state.lengths.tolist()
        unseen = [c[n:] for c, n in zip(contexts, lengths)]
        ids, valid = pad_ragged(unseen, "left", device=self.state.device)
        logits = self.state.forward(ids, valid, logits_to_keep=1)[:, -1]
        self._fed = 0

        def feed(tok: torch.Tensor) -> torch.Tensor:
            self._fed += 1
            return self.state.forward(tok[:, None], logits_to_keep=1)[:, -1]

        stop = None
        threshold = self.confidence
        if threshold is not None:

            def stop(logits: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
                # HF's assistant_confidence_threshold rule: keep the token, stop after it when the
                # draft's own (untempered) probability of it is below the threshold
                return torch.softmax(logits.float(), dim=-1).gather(1, tok[:, None]).squeeze(1) < threshold

        return sample_chain(logits, max_draft, self.sampling, self.generator, feed, stop)

    def accepted(self, n_accepted: torch.Tensor, draft: Draft) -> None:
        keep = torch.clamp(n_accepted.to(self.state.device), max=self._fed)
        self.state.rollback(self._fed - keep)

    def select_rows(self, keep: list[int]) -> None:
        self.state.select_rows(keep)
