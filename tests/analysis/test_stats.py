"""The pooled rows of analysis/stats.py: the prompt is the unit of every interval, checked by value.

A row pooled from cells with repeats must count distinct prompts, hold each prompt's pairs together
and give exactly the interval of metrics.ratio_ci / mean_ci over per-prompt values.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from specstudy import intervals
from specstudy import metrics as M
from specstudy.analysis import stats
from specstudy.records import Cell, Request, Sampling


class _Study:
    """What pooled() reads: records per cell, each cell's repeat and baseline."""

    def __init__(self):
        self.records, self.cells = {}, {}

    def add(self, cid, recs, repeat=0, baseline=None):
        self.records[cid] = recs
        self.cells[cid] = {"repeat": repeat, "baseline_cell_id": baseline}

    def meta(self, cid):
        return self.cells[cid]

    def baseline(self, cid):
        b = self.cells[cid]["baseline_cell_id"]
        return self.records.get(b, []) if b else []


def _rec(method, pid, repeat, end, tokens=33, acc=None, drafted=None, steps=None, entropy=None):
    cell = Cell("s", "cpu", "reference", method, "code", "m", gamma=None if method == "ar" else 4, repeat=repeat)
    r = cell.new_record(Request(pid, "x"), Sampling(), output_tokens=tokens, first_token_s=0.1, end_s=end)
    r.repeat = repeat
    if method != "ar":
        r.accepted_tokens, r.drafted_tokens, r.draft_steps = acc, drafted, steps
        r.target_forwards, r.accepted_per_position, r.drafts_per_position = tokens, [acc], [steps] * 4
    r.token_entropy = entropy
    return r


@pytest.fixture
def study():
    """6 prompts × 3 repeats: per-prompt latency and speedup vary, repeats add 1 % noise."""
    rng = np.random.default_rng(4)
    s = _Study()
    for k in range(3):
        base, spec = [], []
        for i in range(6):
            lat = 2.0 + 0.4 * i
            jitter = 1 + 0.01 * rng.normal()
            base.append(_rec("ar", f"p{i}", k, lat * jitter, entropy=[0.5 + 0.1 * i]))
            spec.append(_rec("ngram", f"p{i}", k, lat / (1.2 + 0.1 * i) * jitter, acc=10 + i, drafted=40, steps=12))
        s.add(f"b{k}", base, k)
        s.add(f"s{k}", spec, k, baseline=f"b{k}")
    return s


def test_a_row_counts_distinct_prompts_and_repeats(study):
    p = stats.pooled(study, ["s0", "s1", "s2"])
    assert p.sample.n_prompts == 6 and p.sample.n_pairs == 18 and p.sample.n_repeats == 3


def test_the_speedup_interval_is_the_one_over_per_prompt_means(study):
    p = stats.pooled(study, ["s0", "s1", "s2"])
    pairs = [pr for c in ("s0", "s1", "s2") for pr in M.paired_records(study.baseline(c), study.records[c])]
    b, s, reps = M.per_prompt_means(pairs)
    assert b.size == 6 and reps == 3
    assert p.paired.speedup == pytest.approx(b.sum() / s.sum())
    assert p.paired.speedup_ci == pytest.approx(intervals.ratio_ci(b, s))
    assert p.paired.speedup_precision == pytest.approx(
        (p.paired.speedup_ci[1] - p.paired.speedup_ci[0]) / 2 / p.paired.speedup
    )
    # the interval of 18 requests taken as independent is narrower: the row does not do that
    flat = intervals.ratio_ci([a.end_s for a, _ in pairs], [z.end_s for _, z in pairs], min_n=2)
    assert flat[1] - flat[0] < p.paired.speedup_ci[1] - p.paired.speedup_ci[0]


def test_alpha_and_al_intervals_sum_each_prompts_counts_first(study):
    p = stats.pooled(study, ["s0", "s1", "s2"])
    acc = np.array([3 * (10 + i) for i in range(6)], float)
    assert p.acceptance.alpha == pytest.approx(acc.sum() / (6 * 3 * 40))
    assert p.acceptance.alpha_ci == pytest.approx(intervals.ratio_ci(acc, np.full(6, 3 * 40.0), upper=1.0))
    lo, hi = intervals.ratio_ci(acc, np.full(6, 3 * 12.0), upper=4.0)  # a step accepts at most its 4 drafted tokens
    assert 1.0 < p.acceptance.acceptance_length_ci[0] < p.acceptance.acceptance_length_ci[1] < 5.0
    assert p.acceptance.acceptance_length_ci == pytest.approx((1 + lo, 1 + hi))


def test_throughput_tpot_and_entropy_intervals_are_per_prompt(study):
    p = stats.pooled(study, ["b0", "b1", "b2"])
    recs = [r for c in ("b0", "b1", "b2") for r in study.records[c]]
    tok = np.array([sum(r.output_tokens for r in recs if r.prompt_id == f"p{i}") for i in range(6)], float)
    e2e = np.array([sum(r.end_s for r in recs if r.prompt_id == f"p{i}") for i in range(6)])
    assert p.throughput.tokens_per_s_ci == pytest.approx(intervals.ratio_ci(tok, e2e))
    tpot = [np.mean([M.tpot(r) for r in recs if r.prompt_id == f"p{i}"]) for i in range(6)]
    assert p.latency.tpot_ci == pytest.approx(intervals.mean_ci(tpot)[1:])
    assert p.quality.entropy_ci == pytest.approx(intervals.mean_ci([0.5 + 0.1 * i for i in range(6)])[1:])


def test_no_interval_for_a_row_of_four_prompts():
    s = _Study()
    s.add("b", [_rec("ar", f"p{i}", 0, 2.0 + i) for i in range(4)])
    s.add("s", [_rec("ngram", f"p{i}", 0, 1.0 + i, acc=5, drafted=10, steps=3) for i in range(4)], baseline="b")
    p = stats.pooled(s, ["s"])
    assert p.sample.n_prompts == 4 and not math.isnan(p.paired.speedup)
    assert all(
        math.isnan(x) for x in (*p.paired.speedup_ci, *p.acceptance.alpha_ci, *p.acceptance.acceptance_length_ci)
    )


def test_a_greedy_divergence_is_named_with_its_position_and_margin():
    s = _Study()
    base = [_rec("ar", f"p{i}", 0, 2.0) for i in range(5)]
    spec = [_rec("ngram", f"p{i}", 0, 1.0, acc=5, drafted=10, steps=3) for i in range(5)]
    for r in base + spec:
        r.output_ids, r.target_logprobs = [1, 2, 3], [-0.1, -0.2, -0.3]
    spec[3].output_ids, spec[3].target_logprobs = [1, 9, 3], [-0.1, -0.23, -0.3]
    s.add("b", base)
    s.add("s", spec, baseline="b")
    p = stats.pooled(s, ["s"])
    assert p.quality.exact_match == pytest.approx(0.8)
    (d,) = p.quality.divergences
    assert (d["prompt_id"], d["position"]) == ("p3", 1) and d["margin"] == pytest.approx(0.03)


def test_batched_throughput_interval_is_over_batches():
    """A cell of batch 2 run batch after batch: tokens/s = Σ batch tokens / Σ batch spans, its interval over
    the batches (each batch holds prompts of its own)."""
    s = _Study()
    recs = []
    for i in range(10):
        r = _rec("ar", f"p{i}", 0, 1.0 + 0.1 * (i % 3), tokens=30 + i)
        r.batch_size, r.start_epoch = 2, 100.0 + 5.0 * (i // 2)
        recs.append(r)
    s.add("b", recs)
    p = stats.pooled(s, ["b"])
    toks = [recs[j].output_tokens + recs[j + 1].output_tokens for j in range(0, 10, 2)]
    walls = [max(recs[j].end_s, recs[j + 1].end_s) for j in range(0, 10, 2)]
    assert p.throughput.tokens_per_s == pytest.approx(sum(toks) / sum(walls))
    assert p.throughput.tokens_per_s_ci == pytest.approx(intervals.ratio_ci(toks, walls))
