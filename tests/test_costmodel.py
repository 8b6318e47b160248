"""The cost model against physics and against the seed article's hardware tables."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specstudy import costmodel as C
from specstudy.config import ParamsError, load_hardware_profile


@given(st.floats(0.0, 1.0), st.integers(1, 12), st.floats(0.0, 1.0))
def test_leviathan_bounds(alpha, gamma, c):
    s = C.leviathan_speedup(alpha, gamma, c)
    assert s <= gamma + 1 + 1e-9
    assert s >= 1.0 / (gamma * c + 1) - 1e-12


def test_leviathan_known_values():
    # Leviathan et al. 2023: α=0.8, γ=5, c=0 gives τ = (1-0.8^6)/0.2 = 3.689
    assert C.leviathan_speedup(0.8, 5, 0.0) == pytest.approx((1 - 0.8**6) / 0.2)
    assert C.leviathan_speedup(0.0, 3, 0.1) == pytest.approx(1 / 1.3)


def test_optimal_gamma_grows_with_alpha_and_shrinks_with_c():
    g_low, _ = C.optimal_gamma(0.5, 0.1)
    g_high, _ = C.optimal_gamma(0.9, 0.1)
    g_cheap, _ = C.optimal_gamma(0.8, 0.01)
    g_dear, _ = C.optimal_gamma(0.8, 0.3)
    assert g_low < g_high and g_dear < g_cheap
    # a rising verification cost lowers the optimum
    g_flat, _ = C.optimal_gamma(0.8, 0.05)
    g_rising, _ = C.optimal_gamma(0.8, 0.05, verify_ratio=lambda g: 1 + 0.2 * g)
    assert g_rising < g_flat


def test_roofline_turns_compute_bound_with_batch():
    hw = load_hardware_profile("a100")
    t1 = C.step_time(7e9, hw, "bf16", batch=1, tokens=1)
    t_verify = C.step_time(7e9, hw, "bf16", batch=1, tokens=5)
    assert t_verify == pytest.approx(t1)  # bandwidth-bound: verifying 5 tokens costs one step
    big = C.step_time(7e9, hw, "bf16", batch=256, tokens=5)
    assert big > 3 * t1  # compute-bound: cost grows with batch x tokens
    p1 = C.predict(hw, 70e9, 7e9, 0.75, batch=1)
    p64 = C.predict(hw, 70e9, 7e9, 0.75, batch=64, gamma=p1.gamma)
    assert p1.regime == "memory-bound" and p64.speedup < p1.speedup
    be = C.break_even_batch(hw, 70e9, 7e9, 0.75, p1.gamma)
    assert be is not None and C.predict(hw, 70e9, 7e9, 0.75, batch=be, gamma=p1.gamma).speedup < 1


def test_70b_needs_two_80gb_gpus():
    hw = load_hardware_profile("a100")
    assert C.min_gpus(70e9, "bf16", hw) == 2
    assert C.min_gpus(7e9, "bf16", hw) == 1


# Seed article, Llama-2-70B target, Llama-2-7B draft, α = 0.75 (speculative sampling rows):
#            AR tok/s  spec tok/s  speedup
SEED = {"a100": (18.5, 42.3, 2.3), "h100": (32.1, 68.5, 2.1)}
TOL = 0.10  # 10 %: the profiles use one achievable-bandwidth fraction (0.65) for every GPU


@pytest.mark.parametrize("gpu", sorted(SEED))
def test_seed_hardware_tables(gpu):
    ar, spec, sp = SEED[gpu]
    p = C.predict(load_hardware_profile(gpu), 70e9, 7e9, 0.75, dtype="fp16")
    assert p.n_devices == 2  # 140 GB of fp16 weights: tensor parallel over two 80 GB cards
    assert p.baseline_tokens_per_s == pytest.approx(ar, rel=TOL)
    assert p.speculative_tokens_per_s == pytest.approx(spec, rel=TOL)
    assert p.speedup == pytest.approx(sp, rel=TOL)


def test_seed_h100_vs_a100_speedup_is_not_physics():
    """The seed says H100's speedup is smaller (2.1x vs 2.3x) because its baseline is faster.

    In a bandwidth-bound roofline both the target and the draft step scale with bandwidth, so c
    and the speedup are the same on both cards (within the fixed per-step overhead); the seed's
    gap comes from engine overheads, not from the hardware.  Documented, not reproduced.
    """
    a = C.predict(load_hardware_profile("a100"), 70e9, 7e9, 0.75, dtype="fp16")
    h = C.predict(load_hardware_profile("h100"), 70e9, 7e9, 0.75, dtype="fp16")
    assert h.baseline_tokens_per_s > 1.5 * a.baseline_tokens_per_s
    assert abs(h.speedup - a.speedup) / a.speedup < 0.03


def test_seed_rtx4090_13b_fp16_does_not_fit_one_card():
    """Seed: Llama-2-13B AR 35.2 tok/s on one RTX 4090 (24 GB).  26 GB of fp16 weights do not fit
    on one card; in int8 (13 GB) the roofline predicts ~50 tok/s, so the seed's figure matches a
    quantised model at lower efficiency, not fp16.  Documented here.
    """
    hw = load_hardware_profile("rtx4090")
    assert C.min_gpus(13e9, "fp16", hw) == 2
    p = C.predict(hw, 13e9, 1.1e9, 0.62, dtype="int8", n_devices=1)
    assert 35.2 < p.baseline_tokens_per_s < 2 * 35.2


def test_cpu_profile_is_measured():
    hw = load_hardware_profile("cpu")
    assert hw.source == "measured" and hw.memory_bandwidth_gbps > 0.1


def test_bad_inputs_are_named():
    hw = load_hardware_profile("a100")
    with pytest.raises(ValueError, match="dtype='fp12'"):
        C.predict(hw, 7e9, None, 0.5, dtype="fp12")
    with pytest.raises(ValueError, match="alpha=1.5"):
        C.predict(hw, 7e9, None, 1.5)
    with pytest.raises(ParamsError, match="hardware='tpu'.*a100"):
        load_hardware_profile("tpu")
    assert math.isfinite(C.predict(hw, 7e9, None, 0.5).speedup)


# ---- drafts that vary: the measured draft-length distribution (DraftMix)


def test_a_mix_where_every_step_drafts_gamma_is_the_leviathan_formula():
    """1024 steps, each drafting 3, accepted at i.i.d. α = 0.5 exactly (512, 256, 128 reach 1, 2, 3)."""
    mix = C.DraftMix(decode_steps=1024, drafted_ge=(1024,) * 3, accepted_ge=(512, 256, 128), gamma=3)
    assert mix.draft_share == 1.0 and mix.acceptance_length(3) == pytest.approx(C.expected_acceptance_length(0.5, 3))
    got = C.mix_speedup(mix, 3, 0.1, lambda k: 1.2)
    assert got == pytest.approx(C.speedup_with_verify_cost(0.5, 3, 0.1, 1.2))


def test_lookup_drafting_on_30_percent_of_steps_predicts_well_below_always_drafting():
    """Same acceptance per draft step, but 70 % of steps find no match: 1 token at one AR step each."""
    every = C.DraftMix(decode_steps=1000, drafted_ge=(1000,) * 4, accepted_ge=(800, 600, 400, 200), gamma=4)
    some = C.DraftMix(decode_steps=1000, drafted_ge=(300,) * 4, accepted_ge=(240, 180, 120, 60), gamma=4)
    v = lambda k: 1.0 + 0.05 * k  # noqa: E731
    assert some.acceptance_length(4) == pytest.approx(every.acceptance_length(4)) == pytest.approx(3.0)
    # hand: tokens 1 + 0.3 · 2 = 1.6 per step; cost 0.7 · 1 + 0.3 · 1.2 = 1.06
    assert C.mix_speedup(some, 4, 0.0, v) == pytest.approx(1.6 / 1.06)
    assert C.mix_speedup(every, 4, 0.0, v) == pytest.approx(3.0 / 1.2)
    assert C.mix_speedup(some, 4, 0.0, v) < 0.7 * C.mix_speedup(every, 4, 0.0, v)


def test_a_mix_cuts_longer_drafts_to_gamma_and_costs_each_length_apart():
    """10 steps: 4 draft nothing, 2 draft 1 (one accepted), 4 draft 4 (accepting 4, 2, 0, 0)."""
    mix = C.DraftMix(decode_steps=10, drafted_ge=(6, 4, 4, 4), accepted_ge=(3, 2, 1, 1), gamma=4)
    assert mix.steps_drafting(4) == {1: 2, 4: 4} and mix.steps_drafting(2) == {1: 2, 2: 4}
    assert mix.acceptance_length(4) == pytest.approx(1 + 7 / 6)
    assert mix.acceptance_length(2) == pytest.approx(1 + 5 / 6)  # the 4-accepting step counts 2 at γ = 2
    verify = {1: 1.1, 2: 1.2, 4: 1.4}.__getitem__
    # hand, γ = 2: tokens (10 + 5) / 10; cost (4 · 0.9 + 2 · (0.05 + 1.1) + 4 · (0.1 + 1.2)) / 10
    want = 1.5 / ((4 * 0.9 + 2 * 1.15 + 4 * 1.3) / 10)
    assert C.mix_speedup(mix, 2, 0.05, verify, no_draft=0.9) == pytest.approx(want)


def test_a_mix_past_its_measured_depth_needs_an_assumed_acceptance():
    mix = C.DraftMix(decode_steps=10, drafted_ge=(6, 4, 4, 4), accepted_ge=(3, 2, 1, 1), gamma=4)
    with pytest.raises(ValueError, match="past the measured depth 4"):
        mix.acceptance_length(6)
    # the one step that accepted all 4 goes on at 0.5 per position: + (0.5 + 0.25) / 6 draft steps
    assert mix.acceptance_length(6, beyond=0.5) == pytest.approx(1 + 7 / 6 + 0.75 / 6)
    assert mix.steps_drafting(6) == {1: 2, 6: 4}  # the steps that drafted the full 4 draft 6


def test_predict_with_a_mix_stays_within_max_gamma():
    """h200 verifies 17 tokens of a 7B model at about one step's cost, so α̂ = 0.9 alone would run to the cap."""
    hw = load_hardware_profile("h200", measure=False)
    mix = C.DraftMix(decode_steps=100, drafted_ge=(30, 30, 20), accepted_ge=(27, 24, 16), gamma=3)
    free = C.predict(hw, 7e9, None, 0.9)
    capped = C.predict(hw, 7e9, None, 0.9, mix=mix, max_gamma=3)
    assert free.gamma == 16 and capped.gamma <= 3 and capped.max_gamma == 3 and not capped.extrapolated
    assert capped.draft_share == pytest.approx(0.3) and capped.speedup < free.speedup
    far = C.predict(hw, 7e9, None, 0.9, mix=mix, max_gamma=8, beyond=0.9)
    assert far.extrapolated == (far.gamma > 3) and far.gamma <= 8
    with pytest.raises(ValueError, match="past the measured depth"):
        C.predict(hw, 7e9, None, 0.9, mix=mix, max_gamma=8)
    with pytest.raises(ValueError, match="non-increasing"):
        C.DraftMix(decode_steps=10, drafted_ge=(2, 3), accepted_ge=(), gamma=2)


def test_a_block_drafter_pays_one_draft_forward_per_step():
    """DESIGN.md: a DFlash drafter drafts a whole block in one forward, so its draft cost is per block."""
    from specstudy.costmodel import draft_cost, speedup_with_verify_cost

    assert draft_cost(8, 0.1) == pytest.approx(0.8) and draft_cost(8, 0.1, block=True) == pytest.approx(0.1)
    assert speedup_with_verify_cost(0.8, 1, 0.1, 1.0, block=True) == speedup_with_verify_cost(0.8, 1, 0.1, 1.0)
    chain, block = (speedup_with_verify_cost(0.8, 8, 0.1, 1.2, block=b) for b in (False, True))
    assert block == pytest.approx(chain * (0.8 + 1.2) / (0.1 + 1.2))


def test_a_measured_block_drafter_mix_pays_its_draft_forward_once_a_step():
    """A DFlash row's measured c is one draft forward (stats.step_costs with block): a step drafting k
    tokens costs c + T(k+1)/T(1), not c·k + T(k+1)/T(1)."""
    mix = dict(decode_steps=10, drafted_ge=(10, 10, 10, 10), accepted_ge=(6, 3, 1), gamma=4, c=0.3)
    chain, block = (C.mix_speedup(C.DraftMix(**mix, block=b), 4, 0.3, lambda k: 1.2) for b in (False, True))
    assert block == pytest.approx(chain * (4 * 0.3 + 1.2) / (0.3 + 1.2))


def test_dflash_is_block_drafting_in_every_engine_that_runs_it():
    from specstudy.frameworks import block_drafting

    assert block_drafting("reference", "dflash") and block_drafting("vllm", "dflash")
    assert not block_drafting("reference", "mtp") and not block_drafting("reference", "eagle3")
