import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specstudy import intervals
from specstudy import metrics as M
from specstudy.records import Cell, Request, Sampling, StepRecord

CELL = Cell("s", "cpu", "reference", "draft_target", "code", "m", gamma=4)


def rec(pid="p", n=5, first=0.1, end=0.5, steps=None, **kw):
    r = CELL.new_record(Request(pid, "x"), Sampling(), output_tokens=n, first_token_s=first, end_s=end, **kw)
    if steps:
        r.steps = steps
        r.fill_acceptance_from_steps()
    return r


@given(st.integers(0, 10_000), st.integers(0, 10_000))
def test_alpha_in_unit_interval(a, b):
    accepted, drafted = min(a, b), max(a, b)
    alpha = M.acceptance_rate(accepted, drafted)
    assert (drafted == 0 and math.isnan(alpha)) or 0.0 <= alpha <= 1.0


def test_alpha_rejects_impossible_counts():
    with pytest.raises(ValueError):
        M.acceptance_rate(5, 4)


@given(st.integers(1, 16))
def test_expected_acceptance_length_limits(gamma):
    assert M.expected_acceptance_length(0.0, gamma) == 1.0
    assert M.expected_acceptance_length(1e-9, gamma) == pytest.approx(1.0, abs=1e-6)
    assert M.expected_acceptance_length(1.0, gamma) == gamma + 1
    assert M.expected_acceptance_length(1 - 1e-9, gamma) == pytest.approx(gamma + 1, rel=1e-5)


@given(st.floats(0.0, 0.999), st.integers(1, 12))
def test_expected_acceptance_length_monotone_and_inverse(alpha, gamma):
    al = M.expected_acceptance_length(alpha, gamma)
    assert 1.0 <= al <= gamma + 1
    assert M.expected_acceptance_length(min(alpha + 1e-3, 1.0), gamma) >= al
    assert M.alpha_from_acceptance_length(al, gamma) == pytest.approx(alpha, abs=1e-6)


def simulate_iid(alpha: float, gamma: int, steps: int, rng) -> list[StepRecord]:
    out = []
    for i in range(steps):
        a = 0
        while a < gamma and rng.random() < alpha:
            a += 1
        out.append(StepRecord(gamma, a, a + 1, float(i)))
    return out


@settings(max_examples=25, deadline=None)
@given(st.floats(0.05, 0.95), st.integers(1, 8), st.integers(0, 2**31))
def test_formula_and_empirical_acceptance_length_agree_on_iid_acceptance(alpha, gamma, seed):
    rng = np.random.default_rng(seed)
    steps = simulate_iid(alpha, gamma, 4000, rng)
    r = rec(n=sum(s.emitted for s in steps), steps=steps)
    summary = M.acceptance_summary([r])
    # AL of 4000 i.i.d. steps: std ≤ (γ+1)/sqrt(4000) ≈ 0.14 for γ = 8; 5 sigma bound
    assert summary["acceptance_length"] == pytest.approx(
        M.expected_acceptance_length(alpha, gamma), abs=5 * (gamma + 1) / math.sqrt(4000)
    )
    # α̂ (the MLE over reached positions) recovers the i.i.d. α; the empirical α does not
    assert summary["alpha_hat"] == pytest.approx(alpha, abs=0.05)
    # under i.i.d. acceptance the conditional rate is α at every position; the unconditional one decays as α^k
    cond, uncond = summary["per_position_conditional"], summary["per_position_unconditional"]
    assert cond[0] == pytest.approx(alpha, abs=0.05) and uncond[0] == pytest.approx(alpha, abs=0.05)
    if gamma >= 2 and alpha > 0.3:
        assert cond[1] == pytest.approx(alpha, abs=0.08) and uncond[1] == pytest.approx(alpha**2, abs=0.06)


def test_empirical_alpha_differs_from_iid_alpha():
    # each step: γ=4, accepts 2 then rejects: α = 2/4 but α̂ = 2/3 (2 accepted of 3 reached)
    steps = [StepRecord(4, 2, 3, float(i)) for i in range(10)]
    s = M.acceptance_summary([rec(n=30, steps=steps)])
    assert s["alpha"] == pytest.approx(0.5)
    assert s["alpha_hat"] == pytest.approx(2 / 3)
    assert s["acceptance_length"] == pytest.approx(3.0)
    assert s["per_position_unconditional"] == [1.0, 1.0, 0.0, 0.0]
    assert s["per_position_conditional"][:3] == [1.0, 1.0, 0.0] and math.isnan(s["per_position_conditional"][3])


def test_acceptance_length_is_not_tokens_per_forward():
    """The prompt pass and forwards that drafted nothing count as forwards, not as draft steps:
    on the same records AL (vLLM's figure) is larger than tokens per target forward."""
    steps = [StepRecord(0, 0, 1, 0.0)] + [StepRecord(4, a, a + 1, float(i)) for i, a in enumerate((3, 0, 4, 2))]
    steps += [StepRecord(0, 0, 1, 9.0)] * 3  # n-gram found nothing: plain decode steps
    r = rec(n=sum(s.emitted for s in steps), steps=steps)
    s = M.acceptance_summary([r])
    assert r.draft_steps == 4 and r.target_forwards == 8
    assert s["acceptance_length"] == pytest.approx(1 + 9 / 4) == M.acceptance_length(9, 4)
    assert s["tokens_per_forward"] == pytest.approx(17 / 8)
    assert s["acceptance_length"] > s["tokens_per_forward"]


def test_ar_has_no_draft_steps():
    steps = [StepRecord(0, 0, 1, float(i)) for i in range(7)]
    r = rec(n=7, steps=steps)
    s = M.acceptance_summary([r])
    assert M.tokens_per_forward(r.output_tokens, r.target_forwards) == 1.0
    assert math.isnan(s["alpha"]) and math.isnan(s["acceptance_length"]) and r.draft_steps == 0


def test_old_records_count_draft_steps_from_their_steps():
    steps = [StepRecord(0, 0, 1, 0.0), StepRecord(2, 1, 2, 1.0)]
    r = rec(n=3, steps=steps)
    r.draft_steps = None  # a part written before the counter existed
    assert M.draft_steps_of(r) == 1 and M.acceptance_summary([r])["acceptance_length"] == 2.0


def test_perplexity_difference_and_the_shift_test():
    base = [rec(pid=f"p{i}", target_logprobs=[-1.0, -2.0]) for i in range(12)]
    same = [rec(pid=f"p{i}", target_logprobs=[-2.0, -1.0]) for i in range(12)]
    worse = [rec(pid=f"p{i}", target_logprobs=[-3.0, -3.5 - 0.01 * i]) for i in range(12)]
    assert M.perplexity_difference(base, same) == pytest.approx(0.0)
    assert M.perplexity_difference(base, worse) > 0
    assert M.logprob_shift_test(base, same)["p_value"] == 1.0
    shifted = M.logprob_shift_test(base, worse)
    assert shifted["p_value"] < 0.01 and shifted["mean_diff"] < 0 and shifted["n_prompts"] == 12


def test_latencies():
    r = rec(n=5, first=0.1, end=0.5, chunk_times_s=[0.1, 0.2, 0.5], chunk_tokens=[1, 1, 3])
    assert M.ttft(r) == 0.1 and M.e2e(r) == 0.5
    assert M.tpot(r) == pytest.approx(0.4 / 4)
    assert M.itl(r) == pytest.approx([0.1, 0.3])


@pytest.mark.parametrize("n", [0, 1])
def test_tpot_of_one_token_output_is_nan_not_a_crash(n):
    assert math.isnan(M.tpot(rec(n=n, first=0.1, end=0.1)))


def test_percentiles_and_summary_ignore_failed():
    ok = [rec(f"p{i}", n=5, first=0.1 * (i + 1), end=1.0 + i) for i in range(10)]
    bad = rec("x", n=0, first=None, end=None)
    bad.status = "timeout"
    s = M.latency_summary(ok + [bad])
    assert s["n"] == 10
    assert s["ttft_s_p50"] == pytest.approx(np.percentile([0.1 * (i + 1) for i in range(10)], 50))
    assert s["e2e_s_p99"] <= 10.0


def test_paired_speedup_and_ci():
    base = [rec(f"p{i}", end=2.0 + 0.1 * i) for i in range(20)]
    spec = [rec(f"p{i}", end=1.0 + 0.05 * i) for i in range(20)]
    spec.append(rec("unpaired", end=0.01))  # not in the baseline: ignored
    out = M.paired_speedup(base, spec)
    assert out["n_prompts"] == 20 and out["repeats"] == 1
    assert out["speedup"] == pytest.approx(2.0)
    assert out["ci_low"] <= 2.0 <= out["ci_high"]


def test_ratio_ci_narrows_with_more_prompts():
    rng = np.random.default_rng(0)
    b = rng.uniform(1, 3, 400)
    s = b / rng.normal(1.5, 0.2, 400)
    lo1, hi1 = intervals.ratio_ci(b[:20], s[:20])
    lo2, hi2 = intervals.ratio_ci(b, s)
    assert hi2 - lo2 < hi1 - lo1
    assert lo2 < M.speedup(b, s) < hi2


def test_speedup_rejects_unpaired_lengths():
    with pytest.raises(ValueError, match="paired"):
        M.speedup([1, 2], [1])


def test_quality_metrics():
    assert M.perplexity([math.log(0.5)] * 4) == pytest.approx(2.0)
    assert math.isnan(M.perplexity([]))
    a = [rec("a", output_ids=[1, 2]), rec("b", output_ids=[3])]
    b = [rec("a", output_ids=[1, 2]), rec("b", output_ids=[4])]
    assert M.exact_match_rate(a, b) == 0.5
    assert M.memory_overhead(300, 100) == 200
    assert math.isnan(M.memory_overhead(None, 100))


def test_throughput():
    rs = [rec(f"p{i}", n=10, end=1.0, start_epoch=100.0 + i) for i in range(3)]
    assert M.output_throughput(rs) == pytest.approx(30 / 3.0)
    assert M.per_request_throughput(rs) == pytest.approx(10.0)


def test_a_speculative_repeat_is_paired_with_its_own_repeats_baseline():
    """Repeat 0 ran on a quiet machine (AR 1 s, speculative 0.5 s), repeat 1 on a slow one (3 s and
    1.5 s): each pair is 2x.  Keyed on prompt and turn only, repeat 0's speculative run would meet
    repeat 1's baseline and the speedup would read 3x."""

    def rec_of(method, repeat, e2e):
        cell = Cell("s", "cpu", "reference", method, "code", "m", repeat=repeat)
        r = cell.new_record(Request("p0", "x"), Sampling(), output_tokens=8, first_token_s=0.01, end_s=e2e)
        r.repeat = repeat
        return r

    base = [rec_of("ar", 0, 1.0), rec_of("ar", 1, 3.0)]
    spec = [rec_of("ngram", 0, 0.5), rec_of("ngram", 1, 1.5)]
    pairs = M.paired_records(base, spec)
    assert [(b.repeat, s.repeat) for b, s in pairs] == [(0, 0), (1, 1)]
    assert M.paired_speedup(base, spec)["speedup"] == pytest.approx(2.0)
    assert M.paired_speedup(base, spec)["n_prompts"] == 1  # one prompt, its repeats nested in it


def test_counters_pool_by_summing_and_pad_per_position_to_the_deepest_part():
    a = M.Counters(drafted=8, accepted=5, draft_steps=2, accepted_per_position=(2, 2, 1))
    b = M.Counters(drafted=4, accepted=1, draft_steps=2, accepted_per_position=(1,))
    c = M.Counters.pooled([a, b])
    assert (c.drafted, c.accepted, c.draft_steps, c.accepted_per_position) == (12, 6, 4, (3, 2, 1))
    assert c.alpha == M.acceptance_rate(6, 12) and c.acceptance_length == M.acceptance_length(6, 4)
    assert c.per_position_unconditional == M.per_position_unconditional([3, 2, 1], 4)


def test_counters_without_step_counts_leave_al_unknown():
    c = M.Counters.pooled([M.Counters(4, 2, 1), M.Counters(4, 2, None)])
    assert c.draft_steps is None and c.acceptance_length is None and c.alpha == 0.5
