"""ngram: prompt lookup decoding — draft-free, the drafts are copied from the context.

For n from ``ngram_max`` down to ``ngram_min``: find the *first* (leftmost) earlier occurrence
of the context's last n tokens that has a continuation, and propose up to γ tokens that followed
it.  This is the rule of HF transformers' ``prompt_lookup_num_tokens`` (its
PromptLookupCandidateGenerator, ngram_max = max_matching_ngram_size, ngram_min = 1), so the two
engines' acceptance counts can be compared.  Drafts are deterministic: under sampling the verify
step treats q as one-hot, which keeps the output distribution exact.

``dynamic_gamma: cost`` caps each row's draft at the length the cost model says pays most, from
the row's acceptance so far and the target's measured verification-cost curve
(:class:`specstudy.engine.speculate.CostAwareGamma`; the curve is measured once per model and
batch size in the process, a few forwards).  ``off`` (the default) drafts up to γ, as HF does.
``draft_in_prefill: on`` looks up drafts in the prompt and verifies them in the prompt pass
(HF's first step).  ``synthetic_acceptance: alpha=0.8`` (or ``length=3.0``) keeps drafts at a
fixed rate instead of verifying them, to time the system (:mod:`specstudy.synthetic`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...synthetic import parse_synthetic
from ..speculate import CostAwareGamma, Draft, StaticGamma
from ..stepcost import verify_ratio
from ..trace import RowTrace
from . import (
    DRAFT_IN_PREFILL,
    SYNTHETIC,
    DecodeJob,
    EngineMethod,
    chain_decode,
    draft_in_prefill,
    one_of,
    positive_int,
)

#: what a study is checked against, read as a literal (no import, no torch) by
#: specstudy.frameworks.reference; SPEC below is built from it
HEADER = {
    "name": "ngram",
    "family": "ngram",
    "order": 20,
    "needs_drafter": False,
    "uses_gamma": True,
    "max_batch": None,
    "options": ("ngram_min", "ngram_max", "dynamic_gamma", "draft_in_prefill", "synthetic_acceptance"),
    "title": "Prompt lookup (n-gram)",
    "drafts_from": "prompt n-grams",
}


def lookup(context: Sequence[int], max_tokens: int, ngram_min: int, ngram_max: int) -> list[int]:
    """The continuation of the leftmost earlier match of the longest matching suffix n-gram."""
    if max_tokens <= 0:
        return []
    n_ctx = len(context)
    for n in range(min(ngram_max, n_ctx - 1), ngram_min - 1, -1):
        suffix = list(context[n_ctx - n :])
        first = suffix[0]
        for start in range(0, n_ctx - n):
            if context[start] == first and list(context[start : start + n]) == suffix:
                cont = list(context[start + n : min(start + n + max_tokens, n_ctx)])
                if cont:
                    return cont
    return []


class NgramDrafter:
    def __init__(self, ngram_min: int, ngram_max: int, device: str | torch.device):
        if ngram_min > ngram_max:
            raise ValueError(f"ngram_min={ngram_min} > ngram_max={ngram_max}")
        self.ngram_min, self.ngram_max, self.device = ngram_min, ngram_max, torch.device(device)

    def propose(self, contexts: list[list[int]], max_draft: list[int]) -> Draft:
        found = [lookup(c, m, self.ngram_min, self.ngram_max) for c, m in zip(contexts, max_draft)]
        width = max((len(f) for f in found), default=0)
        tokens = torch.zeros((len(found), width), dtype=torch.long)
        for b, f in enumerate(found):
            tokens[b, : len(f)] = torch.as_tensor(f, dtype=torch.long)
        n = torch.as_tensor([len(f) for f in found], dtype=torch.long)
        return Draft(tokens.to(self.device), n.to(self.device), None)

    def accepted(self, n_accepted: torch.Tensor, draft: Draft) -> None:
        pass

    def select_rows(self, keep: list[int]) -> None:
        pass


def decode(job: DecodeJob) -> list[RowTrace]:
    drafter = NgramDrafter(job.option("ngram_min", 1), job.option("ngram_max", 3), job.device)
    return chain_decode(job, drafter, job.generator(), gamma_policy(job), draft_in_prefill(job))


def gamma_policy(job: DecodeJob) -> StaticGamma | CostAwareGamma:
    if job.option("dynamic_gamma", "off") == "cost":
        ratio = verify_ratio(job.target, job.prompts[0], job.draft_length, len(job.prompts), job.device)
        return CostAwareGamma(job.draft_length, ratio, c=0.0)  # a lookup costs ~0.1 % of a target step
    return StaticGamma(job.draft_length)


def _cross_check(options: dict[str, Any]) -> None:
    lo, hi = options.get("ngram_min", 1), options.get("ngram_max", 3)
    if lo > hi:
        raise ValueError(f"method 'ngram': ngram_min={lo} > ngram_max={hi}")


SPEC = EngineMethod.from_header(
    HEADER,
    decode=decode,
    options={
        "ngram_min": positive_int,
        "ngram_max": positive_int,
        "dynamic_gamma": one_of("off", "cost"),
        "draft_in_prefill": DRAFT_IN_PREFILL,
        SYNTHETIC: parse_synthetic,
    },
    cross_check=_cross_check,
    description="prompt lookup (n-gram) drafting, draft-free",
)
