"""The cost-aware γ policy and the measured verification-cost curve it decides with."""

import pytest
import torch

from specstudy import costmodel, metrics
from specstudy.data.model_files import tiny_model
from specstudy.engine.speculate import CostAwareGamma
from specstudy.engine.stepcost import measure_verify_time, verify_ratio

torch.set_num_threads(1)

#: the shape measured for SmolLM2-135M on the dev CPU: cheap up to k = 3, a jump at k = 4
CPU_LIKE = [1.0, 1.11, 1.20, 1.64, 1.75, 1.9, 1.98]
FLAT = [1.0] * 7


def test_alpha_hat_prior_is_the_beta_posterior_mean():
    assert metrics.alpha_hat([], [], prior=(1.0, 1.0)) == 0.5
    assert metrics.alpha_hat([], []) != metrics.alpha_hat([], [])  # NaN without a prior
    # 2 steps drafting 3: one accepted all 3, one rejected the first -> reached 3 + 1, accepted 3
    acc, drafted = [1, 1, 1], [2, 2, 2]
    assert metrics.alpha_hat(acc, drafted) == pytest.approx(3 / 4)
    assert metrics.alpha_hat(acc, drafted, prior=(1.0, 1.0)) == pytest.approx(4 / 6)


def test_policy_before_any_draft_uses_alpha_one_half():
    p = CostAwareGamma(6, CPU_LIKE)
    want = costmodel.optimal_gamma(0.5, 0.0, 6, CPU_LIKE)[0]
    assert p.gammas([0, 1]) == [want, want]
    assert want == 2  # the jump at k = 4 makes 3+ drafts a loss at α = 0.5


def test_flat_verification_and_high_acceptance_draft_the_maximum():
    p = CostAwareGamma(6, FLAT)
    for _ in range(20):
        p.update([0], [6], [6])
    assert p.alpha(0) == pytest.approx(metrics.alpha_hat([20] * 6, [20] * 6, prior=(1.0, 1.0)))
    assert p.gammas([0]) == [6]


def test_rejections_shorten_one_row_only():
    p = CostAwareGamma(6, CPU_LIKE, c=0.05)
    for _ in range(10):
        p.update([0, 1], [4, 4], [4, 0])
    g_good, g_bad = p.gammas([0, 1])
    assert p.alpha(1) < 0.1 < 0.9 < p.alpha(0)
    assert g_bad == 1 and g_good > g_bad
    assert g_good == costmodel.optimal_gamma(p.alpha(0), 0.05, 6, CPU_LIKE)[0]


def test_policy_needs_the_whole_curve():
    with pytest.raises(ValueError, match="gamma_max \\+ 1 = 7"):
        CostAwareGamma(6, [1.0, 1.1])


def test_measured_curve_is_positive_and_cached():
    model = tiny_model(seed=0, dtype="float32", num_layers=2)
    times = measure_verify_time(model, [1, 2, 3, 4], [1, 3], repeats=2)
    assert set(times) == {1, 3} and all(t > 0 for t in times.values())
    r = verify_ratio(model, [1, 2, 3], 3, repeats=1)
    assert len(r) == 4 and r[0] == 1.0 and all(x > 0 for x in r)
    assert verify_ratio(model, [7, 8, 9], 3) == r  # once per model, γ and batch size
    with pytest.raises(ValueError, match="empty"):
        measure_verify_time(model, [], [1])


def test_draft_cost_ratio_orders_a_small_draft_below_its_target():
    from specstudy.engine.stepcost import draft_cost_ratio

    big = tiny_model(seed=0, dtype="float32", num_layers=8, hidden_size=128, num_heads=4)
    small = tiny_model(seed=1, dtype="float32", num_layers=1, hidden_size=128, num_heads=4)
    c = draft_cost_ratio(small, big, [1, 2, 3, 4], repeats=5)
    assert 0 < c < 1  # 1 layer against 8 of the same width
    assert draft_cost_ratio(small, big, [5, 6]) == c  # cached per pair


def test_thread_clock_counts_the_work_not_the_time_the_thread_waits():
    """A step timer on the thread clock (a benchmark on a shared machine) leaves out what the thread
    did not run; on the wall clock (the default, restored) the same wait counts."""
    import time

    from specstudy.engine.trace import Timer, use_thread_clock

    assert use_thread_clock(True) is False
    try:
        with Timer() as waited:
            time.sleep(0.05)
        with Timer() as worked:
            t0 = time.thread_time()
            while time.thread_time() - t0 < 0.02:
                pass
    finally:
        assert use_thread_clock(False) is True
    with Timer() as wall:
        time.sleep(0.05)
    assert waited.s < 0.01 and worked.s >= 0.02 and wall.s >= 0.05
