"""Speculative sampling is exact: the sampled tokens follow the target's distribution.

On tiny random models with a 5-token vocabulary, N rows of one batch each sample the first 4
tokens (the prefill token, then a step with up to 2 drafts, their acceptance or resampling and
the bonus token).  The joint distribution of the 4 tokens (625 outcomes) is computed exactly
from the target's logits under the same sampling transform, and compared with a chi-square
goodness-of-fit test at significance 0.001 (cells with expected count < 5 pooled; the p-value
from the exact chi-square upper tail, tests/exact_distribution.py).  Seeds are fixed, so the
test is deterministic.  A negative control shows the test rejects the draft's own distribution.
"""

import pytest
import torch
from exact_distribution import chi_square_p
from exact_distribution import exact_joint as _exact_joint

from specstudy.data.model_files import tiny_model
from specstudy.engine.methods import DecodeJob, get_method
from specstudy.records import Sampling

torch.set_num_threads(1)

V, K, N, SIGNIFICANCE = 5, 4, 12000, 1e-3
PROMPT = [0, 3, 1]


def sampled_counts(method: str, sampling: Sampling, target, **kw) -> torch.Tensor:
    rows = get_method(method).decode(DecodeJob(target, [PROMPT] * N, sampling, **kw))
    index = torch.tensor([sum(t * V ** (K - 1 - i) for i, t in enumerate(r.output_ids)) for r in rows])
    return torch.bincount(index, minlength=V**K).double()


@pytest.fixture(scope="module")
def models():
    target = tiny_model(seed=11, vocab_size=V, num_layers=2, logit_scale=15.0)
    drafter = tiny_model(seed=12, vocab_size=V, num_layers=1, logit_scale=15.0)
    return target, drafter


@pytest.mark.parametrize(
    "sampling",
    [
        Sampling(temperature=1.0, seed=1, max_new_tokens=K),
        Sampling(temperature=0.7, top_k=4, top_p=0.9, seed=2, max_new_tokens=K),
    ],
    ids=["t1", "t0.7-topk4-topp0.9"],
)
def test_draft_target_samples_the_target_distribution(models, sampling):
    target, drafter = models
    p = exact_joint(target, sampling)
    q = exact_joint(drafter, sampling)
    assert 0.5 * (p - q).abs().sum() > 0.2  # the draft really differs from the target
    counts = sampled_counts("draft_target", sampling, target, drafter=drafter, gamma=3)
    assert chi_square_p(counts, N * p) > SIGNIFICANCE


def test_drafts_verified_in_the_prefill_sample_the_target_distribution_too(models):
    """draft_in_prefill: the first token is itself a verified draft (accepted or resampled)."""
    target, drafter = models
    s = Sampling(temperature=1.0, seed=5, max_new_tokens=K)
    rows = get_method("draft_target").decode(
        DecodeJob(target, [PROMPT] * 8, s, drafter=drafter, gamma=2, options={"draft_in_prefill": "on"})
    )
    assert all(r.steps[0].drafted == 2 for r in rows)
    counts = sampled_counts("draft_target", s, target, drafter=drafter, gamma=2, options={"draft_in_prefill": "on"})
    assert chi_square_p(counts, N * exact_joint(target, s)) > SIGNIFICANCE


def test_ngram_sampling_is_exact_too(models):
    target, _ = models
    s = Sampling(temperature=1.0, seed=3, max_new_tokens=K)
    counts = sampled_counts("ngram", s, target, gamma=3, options={"ngram_min": 1})
    assert chi_square_p(counts, N * exact_joint(target, s)) > SIGNIFICANCE


def test_negative_control_the_test_rejects_the_draft_distribution(models):
    target, drafter = models
    s = Sampling(temperature=1.0, seed=4, max_new_tokens=K)
    counts = sampled_counts("ar", s, drafter)  # samples of q, not p
    assert chi_square_p(counts, N * exact_joint(target, s)) < SIGNIFICANCE


def exact_joint(model, sampling):
    return _exact_joint(model, sampling, V, K, PROMPT)
