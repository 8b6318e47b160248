"""Synthetic acceptance (benchmark-only): the rule's exact distribution, the α and AL it reaches
through every method, the target's own choice after the kept drafts, validation, the record flag."""

import math

import pytest
import torch
from exact_distribution import chi_square_p

from specstudy import metrics
from specstudy.backends.reference.reference_backend import ReferenceBackend
from specstudy.data.model_files import tiny_model
from specstudy.engine import drafters as D
from specstudy.engine.methods import DecodeJob, get_method
from specstudy.engine.sampling import make_generator
from specstudy.engine.verify import verify_synthetic
from specstudy.records import Cell, Request, Sampling
from specstudy.synthetic import SyntheticAcceptance, parse_synthetic

torch.set_num_threads(1)
SIGNIFICANCE = 1e-3
PROMPTS = [[1, 2, 3, 4, 5, 6, 1, 2, 3], [7, 8, 9], [4, 4, 4, 4, 5], [2, 3, 2, 3, 2]]
GREEDY = Sampling(temperature=0.0, max_new_tokens=20)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, num_layers=3, logit_scale=8.0)


@pytest.fixture(scope="module")
def drafter():
    return tiny_model(seed=1, num_layers=1, logit_scale=8.0)


def decode(method, target, prompts, sampling, gamma=4, drafter=None, **options):
    spec = get_method(method)
    opts = spec.check(gamma, len(prompts), drafter, options)
    return spec.decode(DecodeJob(target, prompts, sampling, gamma=gamma, drafter=drafter, options=opts))


def drafting_steps(rows):
    return [s for r in rows for s in r.steps if s.drafted > 0]


# --------------------------------------------------------------------------------------------
# the rule itself


def test_alpha_rule_keeps_a_truncated_geometric_number_of_drafts():
    """P(kept = k) = α^k (1 − α) for k < γ and α^γ for k = γ: exactly i.i.d. acceptance."""
    a, g, n = 0.7, 4, 50000
    kept = SyntheticAcceptance("alpha", a).draws(seed=3)(torch.full((n,), g))
    exact = torch.tensor([a**k * (1 - a) for k in range(g)] + [a**g], dtype=torch.float64)
    counts = torch.bincount(kept, minlength=g + 1).double()
    assert chi_square_p(counts, n * exact) > SIGNIFICANCE
    shifted = torch.tensor([0.65**k * 0.35 for k in range(g)] + [0.65**g], dtype=torch.float64)
    assert chi_square_p(counts, n * shifted) < SIGNIFICANCE  # the test tells α = 0.65 apart


def test_length_rule_mixes_the_two_integers_around_l_minus_1_and_caps_at_n_draft():
    rule, n = SyntheticAcceptance("length", 2.25), 40000
    kept = rule.draws(seed=1)(torch.full((n,), 4))
    assert set(kept.tolist()) == {1, 2}
    assert abs(kept.double().mean().item() - 1.25) < 4 * math.sqrt(0.25 * 0.75 / n)
    assert rule.draws(seed=1)(torch.tensor([0, 1, 4])).tolist()[:2] == [0, 1]  # capped by n_draft
    assert SyntheticAcceptance("length", 3.0).draws(0)(torch.full((100,), 5)).tolist() == [2] * 100


def test_after_the_kept_drafts_the_target_chooses_as_real_verification_does():
    """Greedy: argmax after the prefix.  Sampling: after a (synthetic) rejection of a one-hot
    draft the next token comes from the residual, which never holds the rejected draft."""
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.2], [0.1, 0.1, 0.8]]], dtype=torch.float64))
    drafts, n_draft = torch.tensor([[0]]), torch.tensor([1])
    greedy = verify_synthetic(drafts, n_draft, logits, Sampling(temperature=0.0), torch.tensor([0]))
    assert greedy.accepted.tolist() == [0] and greedy.next_token.tolist() == [0]  # target's argmax, = the draft
    kept = verify_synthetic(drafts, n_draft, logits, Sampling(temperature=0.0), torch.tensor([1]))
    assert kept.emitted(drafts) == [[0, 2]]  # the kept draft, then the bonus argmax
    s, g = Sampling(temperature=1.0), make_generator(0)
    nxt = [int(verify_synthetic(drafts, n_draft, logits, s, torch.tensor([0]), None, g).next_token) for _ in range(400)]
    assert 0 not in nxt and {1, 2} <= set(nxt)


# --------------------------------------------------------------------------------------------
# through the methods


@pytest.mark.parametrize(
    "sampling", [GREEDY, Sampling(temperature=1.0, seed=4, max_new_tokens=20)], ids=["greedy", "t1"]
)
def test_empirical_alpha_of_a_long_run_is_the_requested_alpha(target, drafter, sampling):
    """Each reached position is one Bernoulli(α) trial: accepted / reached within 4 binomial σ."""
    from dataclasses import replace

    a = 0.7
    rows = decode(
        "draft_target",
        target,
        PROMPTS,
        replace(sampling, max_new_tokens=240),
        gamma=4,
        drafter=drafter,
        synthetic_acceptance=f"alpha={a}",
    )
    steps = drafting_steps(rows)
    trials = sum(min(s.accepted + 1, s.drafted) for s in steps)
    accepted = sum(s.accepted for s in steps)
    assert trials > 800
    assert abs(accepted / trials - a) < 4 * math.sqrt(a * (1 - a) / trials)


@pytest.mark.parametrize("method", ["draft_target", "tree"])
def test_fixed_length_mode_reaches_its_acceptance_length(target, drafter, method):
    """length=2.5 with γ = 4: every full drafting step keeps 1 or 2 drafts, AL = 1 + accepted /
    drafting steps within 4 σ of 2.5; length=3.0 keeps exactly 2 in every step that drafts >= 2."""
    prompts = PROMPTS if method == "draft_target" else PROMPTS[:1]
    s = Sampling(temperature=0.0, max_new_tokens=200 if method == "draft_target" else 120)
    rows = [
        r
        for p in ([prompts] if method == "draft_target" else [[p] for p in prompts])
        for r in decode(method, target, p, s, gamma=4, drafter=drafter, synthetic_acceptance="length=2.5")
    ]
    full = [st for st in drafting_steps(rows) if st.drafted >= 2]
    assert {st.accepted for st in full} == {1, 2}
    al = 1 + sum(st.accepted for st in full) / len(full)
    assert abs(al - 2.5) < 4 * math.sqrt(0.25 / len(full))
    rows = decode(method, target, prompts, GREEDY, gamma=4, drafter=drafter, synthetic_acceptance={"length": 3})
    assert {st.accepted for st in drafting_steps(rows) if st.drafted >= 2} == {2}


def _drafters(target):
    torch.manual_seed(0)
    heads = D.MedusaHeads(target.config.hidden_size, num_heads=4, num_layers=1).double()
    eagle = D.EagleDraft.for_target(target.config).double()
    return heads, eagle


def test_alpha_zero_keeps_no_draft_and_emits_the_targets_own_tokens(target, drafter):
    """With every draft rejected each step emits argmax p_1: greedy AR output, through every
    method that verifies drafts (the target verified the real drafts and rolled them back)."""
    heads, eagle = _drafters(target)
    ar = [r.output_ids for r in decode("ar", target, PROMPTS, GREEDY, gamma=None)]
    cases = [
        ("ngram", None, {}),
        ("draft_target", drafter, {}),
        ("layer_skip", None, {"exit_layer": 1}),
        ("heads", heads, {}),
        ("eagle", eagle, {}),
    ]
    for method, d, opts in cases:
        rows = decode(method, target, PROMPTS, GREEDY, gamma=4, drafter=d, synthetic_acceptance="alpha=0", **opts)
        assert [r.output_ids for r in rows] == ar, method
        assert all(st.accepted == 0 for st in drafting_steps(rows)) and drafting_steps(rows), method
    for method, d, opts in [("tree", drafter, {"tree_width": 2}), ("heads", heads, {"heads_tree": "2,2,1,1"})]:
        for p, want in zip(PROMPTS, ar):
            row = decode(method, target, [p], GREEDY, gamma=4, drafter=d, synthetic_acceptance="alpha=0.0", **opts)[0]
            assert row.output_ids == want, method


def test_alpha_one_with_the_target_as_drafter_is_still_the_target(target):
    rows = decode("draft_target", target, PROMPTS, GREEDY, gamma=3, drafter=target, synthetic_acceptance="alpha=1")
    assert [r.output_ids for r in rows] == [r.output_ids for r in decode("ar", target, PROMPTS, GREEDY, gamma=None)]
    assert all(st.accepted == st.drafted for st in drafting_steps(rows))


# --------------------------------------------------------------------------------------------
# validation and the record flag


@pytest.mark.parametrize(
    "value,message",
    [
        ("alpha=1.5", r"alpha=1\.5 is outside \[0, 1\]"),
        ("alpha=-0.1", r"alpha=-0\.1 is outside \[0, 1\]"),
        ("length=0.5", r"length=0\.5 is below 1"),
        ("length=6", r"length=6\.0 cannot be reached with gamma=4: need L in \[1, gamma \+ 1 = 5\]"),
        ("beta=0.5", r"mode 'beta' is not known"),
        ("alpha=abc", r"alpha='abc' is not a number"),
        ("alpha=nan", r"alpha=nan is not a finite number"),
        (0.8, r"0\.8 is not a rule; need 'alpha=A'"),
        ({"alpha": 0.8, "length": 2}, "exactly one key"),
        ({"alpha": True}, "not a number"),
    ],
)
def test_invalid_values_are_refused_with_the_value_and_the_allowed_range(value, message):
    with pytest.raises(ValueError, match=message) as e:
        get_method("draft_target").check(4, 1, "d", {"synthetic_acceptance": value})
    assert "synthetic_acceptance=" in str(e.value)


def test_methods_without_drafts_refuse_it_and_good_forms_parse():
    with pytest.raises(ValueError, match="method 'ar' verifies no drafts.*'draft_target'.*'tree'"):
        get_method("ar").check(None, 1, None, {"synthetic_acceptance": "alpha=0.8"})
    assert get_method("heads").options["synthetic_acceptance"] is parse_synthetic
    assert parse_synthetic(" length = 3 ").label == "length=3.0"
    assert parse_synthetic({"alpha": "0.8"}).label == "alpha=0.8"
    opts = get_method("draft_target").check(
        2, 1, "d", {"synthetic_acceptance": "length=4", "dynamic_gamma": "heuristic", "gamma_max": 3}
    )
    assert opts["synthetic_acceptance"] == SyntheticAcceptance("length", 4.0)  # reachable with gamma_max = 3


def _cell(method, gamma=None, drafter=None, **options):
    return Cell(
        study="t",
        hardware="cpu",
        framework="reference",
        method=method,
        task="adhoc",
        model="tiny",
        drafter=drafter,
        gamma=gamma,
        options=tuple(sorted(options.items())),
    )


def test_records_of_a_synthetic_cell_carry_the_flag_and_are_not_lossless(target, drafter):
    backend = ReferenceBackend(target)
    backend._drafters[("draft_target", "small")] = drafter
    backend._drafters[("tree", "small")] = drafter
    reqs = [Request(f"p{i}", "", prompt_ids=tuple(p)) for i, p in enumerate(PROMPTS)]
    base = list(backend.run(reqs, GREEDY, _cell("ar")))
    real = list(backend.run(reqs, GREEDY, _cell("draft_target", 4, "small")))
    syn = list(backend.run(reqs, GREEDY, _cell("draft_target", 4, "small", synthetic_acceptance="alpha=0.8")))
    tree = list(backend.run(reqs, GREEDY, _cell("tree", 3, "small", synthetic_acceptance="length=3")))
    assert [r.synthetic_acceptance for r in base + real] == [None] * 8
    assert [r.synthetic_acceptance for r in syn] == ["alpha=0.8"] * 4
    assert [r.synthetic_acceptance for r in tree] == ["length=3.0"] * 4
    assert metrics.exact_match_rate(base, real) == 1.0
    assert metrics.exact_match_rate(base, syn) < 1.0  # kept drafts the target would not emit: not lossless
    assert all(r.status == "ok" and r.accepted_tokens > 0 for r in syn + tree)
    with pytest.raises(ValueError, match="alpha=2.0 is outside"):
        next(backend.run(reqs, GREEDY, _cell("draft_target", 4, "small", synthetic_acceptance="alpha=2")))
