"""Synthetic acceptance mapped to the engines that have it (vLLM's synthetic rejection sampler,
SGLang's simulated acceptance length), checked before any engine starts, and marked on records."""

from __future__ import annotations

import pytest

from specstudy import metrics
from specstudy.backends.sglang.sglang_server import SglangServerBackend
from specstudy.backends.vllm.vllm_server import speculative_config
from specstudy.frameworks.declaration import check_method
from specstudy.frameworks.sglang import sglang_synthetic_env
from specstudy.frameworks.vllm import OFFLINE
from specstudy.records import Cell, Request, Sampling


def test_vllm_fields_for_each_rule():
    cfg = speculative_config("ngram", 3, None, {"synthetic_acceptance": "alpha=0.5"})
    assert cfg["rejection_sample_method"] == "synthetic"
    # vLLM's rates are unconditional: P(the first i+1 drafts all accepted) = a^(i+1), non-increasing
    assert cfg["synthetic_acceptance_rates"] == [0.5, 0.25, 0.125]
    cfg = speculative_config("ngram", 4, None, {"synthetic_acceptance": {"length": 3}})
    assert cfg["synthetic_acceptance_length"] == 3.0 and "synthetic_acceptance_rates" not in cfg
    assert "rejection_sample_method" not in speculative_config("ngram", 4, None, {})


def test_sglang_environment_is_an_acceptance_length():
    assert sglang_synthetic_env({"synthetic_acceptance": "length=2.5"}, 4) == {"SGLANG_SIMULATE_ACC_LEN": "2.5"}
    env = sglang_synthetic_env({"synthetic_acceptance": "alpha=0.8"}, 4)
    assert float(env["SGLANG_SIMULATE_ACC_LEN"]) == pytest.approx(metrics.expected_acceptance_length(0.8, 4), rel=1e-5)
    b = SglangServerBackend("/m", python="py", prefix_cache=False)
    cell = Cell("t", "h", "sglang", "ngram", "code", "/m", gamma=4, options=(("synthetic_acceptance", "length=3"),))
    assert b.server_env(cell)["SGLANG_SIMULATE_ACC_LEN"] == "3"
    assert "SGLANG_SIMULATE_ACC_LEN" not in b.server_env(Cell("t", "h", "sglang", "ngram", "code", "/m", gamma=4))


@pytest.mark.parametrize(
    "rule, gamma, match",
    [
        ("alpha=1.5", 4, r"alpha=1.5 is outside \[0, 1\]"),
        ("length=7", 4, r"length=7.0 cannot be reached with gamma=4"),
        ("speed=3", 4, "mode 'speed' is not known"),
    ],
)
def test_a_bad_rule_is_refused_at_validation(rule, gamma, match):
    with pytest.raises(ValueError, match=match):
        check_method(OFFLINE, "ngram", gamma, {"synthetic_acceptance": rule}, None)


def test_records_of_any_engine_carry_the_rule():
    cell = Cell(
        "t", "h", "vllm-server", "ngram", "code", "m", gamma=4, options=(("synthetic_acceptance", "alpha=0.8"),)
    )
    rec = cell.new_record(Request("p", "x"), Sampling())
    assert rec.synthetic_acceptance == "alpha=0.8"
    assert (
        Cell("t", "h", "vllm-server", "ngram", "code", "m", gamma=4)
        .new_record(Request("p", "x"), Sampling())
        .synthetic_acceptance
        is None
    )
