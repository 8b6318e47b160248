"""draft_target: speculative sampling with a separate draft model (Leviathan et al. / Chen et al.).

The draft model proposes γ tokens autoregressively with the shared sampling transform; the
target verifies them in one pass (:mod:`specstudy.engine.verify`); both KV caches roll back
the rejected tokens.  γ is static, or dynamic:

* ``dynamic_gamma: heuristic`` — per row, +2 after a fully accepted step, −1 otherwise
  (HF's "heuristic" schedule), between 1 and ``gamma_max``;
* ``dynamic_gamma: cost`` — per row, the draft length the cost model says pays most, from the
  row's acceptance so far, the measured c and the target's measured verification-cost curve
  (:class:`specstudy.engine.speculate.CostAwareGamma`), at most ``gamma_max`` (default γ);
* ``dynamic_gamma: confidence`` — a row stops drafting after a token the draft model itself
  gives probability < ``draft_confidence`` (HF's assistant_confidence_threshold), at most γ.

``draft_in_prefill: on`` drafts from the prompt and verifies those drafts in the target's
prompt pass (one target forward fewer per request, as HF's assisted generation does).
``synthetic_acceptance: alpha=0.8`` (or ``length=3.0``) keeps drafts at a fixed rate instead of
verifying them, to time the system at that acceptance (:mod:`specstudy.synthetic`).
"""

from __future__ import annotations

from typing import Any

from ...synthetic import parse_synthetic
from ..speculate import CostAwareGamma, HeuristicGamma, ModelDrafter, StaticGamma
from ..stepcost import draft_cost_ratio, verify_ratio
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
    probability,
)

#: what a study is checked against, read as a literal (no import, no torch) by
#: specstudy.frameworks.reference; SPEC below is built from it
HEADER = {
    "name": "draft_target",
    "family": "draft_target",
    "order": 10,
    "needs_drafter": True,
    "uses_gamma": True,
    "max_batch": None,
    "options": (
        "dynamic_gamma",
        "gamma_max",
        "draft_confidence",
        "draft_quantization",
        "draft_in_prefill",
        "synthetic_acceptance",
    ),
    "title": "Speculative sampling (draft/target)",
    "seed_row": "Speculative Sampling",
    "extra_weights": True,
}


def gamma_policy(job: DecodeJob) -> StaticGamma | HeuristicGamma | CostAwareGamma:
    mode = job.option("dynamic_gamma", "off")
    if mode == "heuristic":
        return HeuristicGamma(job.draft_length, job.option("gamma_max", max(16, job.draft_length)))
    if mode == "cost":
        gamma_max = job.option("gamma_max", job.gamma)
        batch = len(job.prompts)
        ratio = verify_ratio(job.target, job.prompts[0], gamma_max, batch, job.device)
        c = draft_cost_ratio(job.drafter, job.target, job.prompts[0], batch, job.device)
        return CostAwareGamma(gamma_max, ratio, c)
    return StaticGamma(job.draft_length)


def confidence(job: DecodeJob) -> float | None:
    if job.option("dynamic_gamma", "off") == "confidence":
        threshold: float = job.option("draft_confidence", 0.4)
        return threshold
    return None


def check_vocab(target: Any, drafter: Any) -> None:
    vt, vd = target.config.vocab_size, drafter.config.vocab_size
    if vt != vd:
        raise ValueError(
            f"draft vocab_size={vd} differs from the target's {vt}: the drafter must share the "
            "target's tokenizer and output layer size"
        )


def decode(job: DecodeJob) -> list[RowTrace]:
    check_vocab(job.target, job.drafter)
    gen = job.generator()
    drafter = ModelDrafter(job.drafter, len(job.prompts), job.sampling, gen, job.device, confidence(job))
    return chain_decode(job, drafter, gen, gamma_policy(job), draft_in_prefill(job))


OPTIONS = {
    "dynamic_gamma": one_of("off", "heuristic", "confidence", "cost"),
    "gamma_max": positive_int,
    "draft_confidence": probability,
    "draft_quantization": one_of("none", "int8"),
    "draft_in_prefill": DRAFT_IN_PREFILL,
    SYNTHETIC: parse_synthetic,
}

SPEC = EngineMethod.from_header(
    HEADER,
    decode=decode,
    options=OPTIONS,
    description="speculative sampling with a draft model (static or dynamic gamma)",
)
