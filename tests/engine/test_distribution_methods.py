"""The safety net before any speed work: every chain method and γ policy samples the target exactly.

Same design as tests/engine/test_distribution.py (tiny float64 models, V = 5, the joint law of
the first K = 4 tokens computed exactly by enumeration, N rows of one batched decode, Pearson's
chi-square at significance 0.001, fixed seeds: deterministic), for what that file does not cover:
layer skip, the heads in linear mode and the dynamic-γ policies (heuristic, confidence, cost).

Each guard has a negative control *close to the bug it guards against*, run at the same N, which
the same test must reject:

* an off-by-one residual: after a rejection at draft i the residual subtracts q of draft i − 1
  (identical to the right one whenever the rejection is at the first draft);
* a skipped rejection: the first draft of every step is kept without its test u·q < p;
* a residual that is not updated: after a rejection the token comes from p itself.

The exact TV distance of each control from the target would need the whole decode enumerated;
what is asserted is the operational claim: at this N, the test tells each bug apart.
"""

import pytest
import torch
from exact_distribution import chi_square_p
from exact_distribution import exact_joint as _exact_joint

import specstudy.engine.verify as verify_mod
from specstudy.data.model_files import tiny_model
from specstudy.engine import drafters as D
from specstudy.engine.methods import DecodeJob, get_method
from specstudy.engine.sampling import sample_from
from specstudy.records import Sampling

torch.set_num_threads(1)

V, K, N, SIGNIFICANCE = 5, 4, 12000, 1e-3
PROMPT = [0, 3, 1]
T1 = Sampling(temperature=1.0, seed=21, max_new_tokens=K)


@pytest.fixture(scope="module")
def models():
    target = tiny_model(seed=11, vocab_size=V, num_layers=2, logit_scale=15.0)
    drafter = tiny_model(seed=12, vocab_size=V, num_layers=1, logit_scale=15.0)
    return target, drafter


@pytest.fixture(scope="module")
def heads(models, tmp_path_factory):
    target, _ = models
    torch.manual_seed(2)
    h = D.MedusaHeads(target.config.hidden_size, num_heads=3, token_conditioned=True)
    for prm in h.parameters():
        torch.nn.init.normal_(prm, std=0.5)
    path = D.save_drafter(h, tmp_path_factory.mktemp("heads") / "h", target="tiny")
    return get_method("heads").load_drafter(str(path), target, "cpu", "float64")


def exact_joint(model, sampling=T1):
    return _exact_joint(model, sampling, V, K, PROMPT)


def decode(method: str, target, n: int = N, sampling: Sampling = T1, **kw):
    return get_method(method).decode(DecodeJob(target, [PROMPT] * n, sampling, **kw))


def counts_of(rows) -> torch.Tensor:
    index = torch.tensor([sum(t * V ** (K - 1 - i) for i, t in enumerate(r.output_ids)) for r in rows])
    return torch.bincount(index, minlength=V**K).double()


def p_value(rows, target) -> float:
    return chi_square_p(counts_of(rows), len(rows) * exact_joint(target))


def drafted_and_rejected(rows) -> tuple[int, int]:
    steps = [s for r in rows for s in r.steps]
    return sum(s.drafted for s in steps), sum(s.accepted < s.drafted for s in steps)


#: case -> (method, DecodeJob keywords from (drafter model, heads))
CASES = {
    "layer_skip": ("layer_skip", lambda d, h: dict(gamma=3, options={"exit_layer": 1})),
    "heads_linear": ("heads", lambda d, h: dict(gamma=3, drafter=h)),
    "draft_target_heuristic": (
        "draft_target",
        lambda d, h: dict(gamma=1, drafter=d, options={"dynamic_gamma": "heuristic", "gamma_max": 3}),
    ),
    "draft_target_confidence": (
        "draft_target",
        lambda d, h: dict(gamma=3, drafter=d, options={"dynamic_gamma": "confidence", "draft_confidence": 0.5}),
    ),
    "draft_target_cost": ("draft_target", lambda d, h: dict(gamma=3, drafter=d, options={"dynamic_gamma": "cost"})),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_method_samples_the_target_distribution(models, heads, case):
    target, drafter = models
    method, job = CASES[case]
    rows = decode(method, target, **job(drafter, heads))
    drafted, rejected = drafted_and_rejected(rows)
    assert drafted > N and rejected > 0.05 * N  # drafts were really proposed and really rejected
    assert p_value(rows, target) > SIGNIFICANCE


def test_eagle3_with_a_reduced_draft_vocabulary_samples_the_target_distribution(models):
    """EAGLE-3 drafts only from its draft vocabulary (ids 0, 2, 3 here): q is 0 on ids 1 and 4,
    which the target reaches through rejections and the bonus token alone."""
    from specstudy.engine.eagle3_drafter import Eagle3Draft

    target, _ = models
    c = target.config
    arch = {
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": c.head_dim,
        "rope_theta": 10000.0,
        "rms_norm_eps": c.rms_norm_eps,
    }
    torch.manual_seed(3)
    draft = Eagle3Draft(arch, V, torch.tensor([0, 2, 3]), aux_layers=(0, 1, 1))
    for prm in draft.parameters():
        torch.nn.init.normal_(prm, std=0.5)
    rows = decode("eagle3", target, gamma=3, drafter=draft.double().eval())
    drafted, rejected = drafted_and_rejected(rows)
    assert drafted > N and rejected > 0.05 * N
    outputs = {t for r in rows for t in r.output_ids}
    assert outputs == set(range(V))  # ids outside the draft vocabulary are still produced
    assert p_value(rows, target) > SIGNIFICANCE


def test_the_drafters_really_differ_from_the_target(models):
    """The tests above would pass trivially if the draft law were the target's."""
    target, drafter = models
    assert 0.5 * (exact_joint(target) - exact_joint(drafter)).abs().sum() > 0.2


# --------------------------------------------------------------------------------------------
# negative controls: bugs one step from the real code


def _off_by_one_residual(n, draft_tokens, n_draft, target_probs, draft_probs, generator):
    """sample_after with q taken one draft too early (n − 1) after a rejection at n ≥ 1."""
    b, g = draft_tokens.shape
    if g == 0:  # a step without drafts (the prefill): nothing to get wrong
        return ORIGINAL_AFTER(n, draft_tokens, n_draft, target_probs, draft_probs, generator)
    rows = torch.arange(b)
    p_n = target_probs[rows, n]
    rejected = n < n_draft
    pos = (n - 1).clamp(min=0, max=g - 1)
    q_n = draft_probs[rows, pos] * rejected[:, None]
    return sample_from(verify_mod.residual(p_n, q_n), generator)


def _skipped_first_rejection(draft_tokens, target_probs, draft_probs, generator):
    ok = ORIGINAL_ACCEPTS(draft_tokens, target_probs, draft_probs, generator)
    ok[:, :1] = True
    return ok


def _residual_is_p(p, q):
    return p


ORIGINAL_ACCEPTS, ORIGINAL_AFTER = verify_mod.sampling_accepts, verify_mod.sample_after
BUGS = {
    "off_by_one_residual": ("sample_after", _off_by_one_residual),
    "skipped_rejection": ("sampling_accepts", _skipped_first_rejection),
    "residual_not_updated": ("residual", _residual_is_p),
}


@pytest.mark.parametrize("bug", sorted(BUGS))
def test_negative_control_a_bug_next_to_the_real_rule_is_detected(models, monkeypatch, bug):
    target, drafter = models
    name, fake = BUGS[bug]
    monkeypatch.setattr(verify_mod, name, fake)
    rows = decode("draft_target", target, gamma=3, drafter=drafter)
    assert p_value(rows, target) < SIGNIFICANCE


def test_the_real_rule_passes_at_the_same_size_and_seed(models):
    """The controls' twin without the bug: the same decode passes (so the controls fail on the bug)."""
    target, drafter = models
    assert p_value(decode("draft_target", target, gamma=3, drafter=drafter), target) > SIGNIFICANCE
