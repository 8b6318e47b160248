import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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
def test_tau_limits(gamma):
    assert M.expected_tau(0.0, gamma) == 1.0
    assert M.expected_tau(1e-9, gamma) == pytest.approx(1.0, abs=1e-6)
    assert M.expected_tau(1.0, gamma) == gamma + 1
    assert M.expected_tau(1 - 1e-9, gamma) == pytest.approx(gamma + 1, rel=1e-5)


@given(st.floats(0.0, 0.999), st.integers(1, 12))
def test_tau_monotone_and_inverse(alpha, gamma):
    tau = M.expected_tau(alpha, gamma)
    assert 1.0 <= tau <= gamma + 1
    assert M.expected_tau(min(alpha + 1e-3, 1.0), gamma) >= tau
    assert M.alpha_from_tau(tau, gamma) == pytest.approx(alpha, abs=1e-6)


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
def test_formula_and_empirical_tau_agree_on_iid_acceptance(alpha, gamma, seed):
    rng = np.random.default_rng(seed)
    steps = simulate_iid(alpha, gamma, 4000, rng)
    r = rec(n=sum(s.emitted for s in steps), steps=steps)
    summary = M.acceptance_summary([r])
    # τ of 4000 i.i.d. steps: std ≤ (γ+1)/sqrt(4000) ≈ 0.14 for γ = 8; 5 sigma bound
    assert summary["tau"] == pytest.approx(M.expected_tau(alpha, gamma), abs=5 * (gamma + 1) / math.sqrt(4000))
    # α̂ (the MLE over reached positions) recovers the i.i.d. α; the empirical α does not
    assert summary["alpha_hat"] == pytest.approx(alpha, abs=0.05)
    k1 = summary["per_position"][0]
    assert k1 == pytest.approx(alpha, abs=0.05)


def test_empirical_alpha_differs_from_iid_alpha():
    # each step: γ=4, accepts 2 then rejects: α = 2/4 but α̂ = 2/3 (2 accepted of 3 reached)
    steps = [StepRecord(4, 2, 3, float(i)) for i in range(10)]
    s = M.acceptance_summary([rec(n=30, steps=steps)])
    assert s["alpha"] == pytest.approx(0.5)
    assert s["alpha_hat"] == pytest.approx(2 / 3)
    assert s["tau"] == pytest.approx(3.0)
    assert s["per_position"] == [1.0, 1.0, 0.0, 0.0]


def test_vllm_convention_equals_tau_when_steps_end_in_bonus():
    steps = [StepRecord(3, a, a + 1, 0.0) for a in (0, 1, 3, 2)]
    r = rec(n=sum(s.emitted for s in steps), steps=steps)
    assert M.vllm_mean_acceptance_length(r.accepted_tokens, r.target_forwards) == M.mean_accepted_length(
        r.output_tokens, r.target_forwards)


def test_ar_has_tau_one():
    steps = [StepRecord(0, 0, 1, float(i)) for i in range(7)]
    r = rec(n=7, steps=steps)
    assert M.mean_accepted_length(r.output_tokens, r.target_forwards) == 1.0
    assert math.isnan(M.acceptance_summary([r])["alpha"])


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
    assert out["n_pairs"] == 20
    assert out["speedup"] == pytest.approx(2.0)
    assert out["ci_low"] <= 2.0 <= out["ci_high"]


def test_bootstrap_ci_narrows_with_more_pairs():
    rng = np.random.default_rng(0)
    b = rng.uniform(1, 3, 400)
    s = b / rng.normal(1.5, 0.2, 400)
    lo1, hi1 = M.bootstrap_ci(b[:20], s[:20])
    lo2, hi2 = M.bootstrap_ci(b, s)
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
