"""The verdict against published numbers (issue 46): records built to sit inside vLLM's acceptance
protocol (AL 2.60, per position 0.730/0.521/0.355, rel tol 5 %) pass; records built with a doubled BOS
and the lower acceptance it causes fail and name that cause; speed and rehearsals get no verdict."""

from __future__ import annotations

import pytest

from specstudy.analysis.published import (
    NO_VERDICT,
    NOT_MEASURED,
    OUTSIDE,
    REHEARSAL,
    WITHIN,
    acceptance_verdict,
    against_published,
    causes_found,
)
from specstudy.config.references import load_references
from specstudy.records import RequestRecord

TARGET = "meta-llama/Llama-3.1-8B-Instruct"
BOS = 128000


def _records(per_pos: tuple[int, int, int], head: list[int], n: int = 80, steps: int = 100) -> list[RequestRecord]:
    """n prompts of the calibration row, each with ``steps`` drafts of 3 and ``per_pos`` accepted at k."""
    return [
        RequestRecord(
            study="h100-1",
            hardware="h100-1",
            framework="vllm",
            method="eagle3",
            label="EAGLE-3 (chain)",
            task="chat",
            prompt_id=f"q{i}",
            repeat=0,
            cell_id="c1",
            model=TARGET,
            sweeps=["calibration"],
            gamma=3,
            max_new_tokens=256,
            output_tokens=256,
            draft_steps=steps,
            drafted_tokens=3 * steps,
            accepted_tokens=sum(per_pos),
            accepted_per_position=list(per_pos),
            drafts_per_position=[steps] * 3,
            extra={"chat_template": True, "prompt_head_ids": head, "max_model_len": 16384},
        )
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def refs():
    return load_references("h100-1")


def _row(refs, records, **kw):
    rows = against_published(refs, records, {"llama3.1-8b": TARGET}, **kw)
    return {r["name"]: r for r in rows}


def test_records_at_the_published_acceptance_pass(refs):
    row = _row(refs, _records((73, 52, 35), [BOS, 128006, 882]))["vllm-eagle3-llama3.1-8b"]
    assert row["verdict"] == WITHIN
    assert row["measured_al"] == pytest.approx(2.60)
    assert row["measured_per_position"] == pytest.approx([0.73, 0.52, 0.35])
    assert row["n_prompts"] == 80
    assert causes_found(row) == []
    assert row["protocol_differences"] == []


def test_a_doubled_bos_fails_and_is_named(refs):
    row = _row(refs, _records((60, 38, 22), [BOS, BOS, 128006]))["vllm-eagle3-llama3.1-8b"]
    assert row["verdict"] == OUTSIDE
    assert row["rel_error"] > 0.05
    assert causes_found(row) == ["doubled_bos"]
    assert [c["ok"] for c in row["checks"] if c["check"] == "chat_template"] == [True]


def test_the_tolerance_is_vllms(refs):
    """AL within ±5 % both ways; each position at least 95 % of the published rate (one-sided)."""
    measured = {"acceptance_length": 2.60 * 1.049, "per_position_unconditional": [0.70, 0.50, 0.34]}
    assert acceptance_verdict(2.60, [0.7296, 0.5208, 0.3545], 0.05, measured)["verdict"] == WITHIN
    measured = {"acceptance_length": 2.60 * 0.949, "per_position_unconditional": [0.73, 0.52, 0.36]}
    assert acceptance_verdict(2.60, [0.7296, 0.5208, 0.3545], 0.05, measured)["verdict"] == OUTSIDE
    measured = {"acceptance_length": 2.60, "per_position_unconditional": [0.80, 0.52, 0.30]}
    v = acceptance_verdict(2.60, [0.7296, 0.5208, 0.3545], 0.05, measured)
    assert (v["verdict"], v["short_positions"]) == (OUTSIDE, [3])


def test_unrecorded_evidence_is_not_a_pass(refs):
    recs = _records((73, 52, 35), [BOS])
    for r in recs:
        r.extra = {}
    row = _row(refs, recs)["vllm-eagle3-llama3.1-8b"]
    assert {c["check"]: c["ok"] for c in row["checks"]} == dict.fromkeys(
        ["chat_template", "doubled_bos", "max_model_len", "drafter_revision", "engine_version"]
    )


def test_a_protocol_difference_is_listed(refs):
    row = _row(refs, _records((73, 52, 35), [BOS], n=76))["vllm-eagle3-llama3.1-8b"]
    assert row["protocol_differences"] == [{"field": "prompts", "published": 80, "measured": [76]}]


def test_speed_rehearsal_and_unmeasured_rows_get_no_verdict(refs):
    recs = _records((10, 5, 1), [BOS, BOS])
    for r in recs:  # a rehearsal runs one cell per configuration: the same row from another sweep
        r.sweeps = ["method_family"]
    assert _row(refs, recs)["vllm-eagle3-llama3.1-8b"]["verdict"] == NOT_MEASURED
    rows = _row(refs, recs, rehearsal=True)
    assert rows["vllm-eagle3-llama3.1-8b"]["verdict"] == REHEARSAL
    assert rows["vllm-eagle3-llama3.1-8b"]["measured_al"] == pytest.approx(1.16)
    assert rows["vllm-eagle3-qwen3-8b"]["verdict"] == NOT_MEASURED
    assert rows["spec-bench-eagle-vicuna-7b"]["verdict"] == NOT_MEASURED
    spec = next(r for r in refs if r.kind == "speed")
    recs = _records((73, 52, 35), [BOS])
    for r in recs:
        r.model, r.label, r.sweeps = "vicuna-7b-v1.3", "EAGLE", []
    assert _row([spec], recs)[spec.name]["verdict"] == NO_VERDICT
