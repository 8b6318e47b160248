"""Predictions from a finished study's measured acceptance: for its own machine with its own measured
step costs (the report's cost-model column), and for another profile's roofline (labelled)."""

from __future__ import annotations

import json
import math

import pytest

from specstudy.analysis import tables
from specstudy.analysis.predict import predict_from_study
from specstudy.analysis.study import load
from specstudy.cli import main
from specstudy.config import load_hardware_profile


def test_own_rows_predicted_from_own_acceptance_and_costs(report_study):
    study = load(report_study)
    per_task = predict_from_study(study)
    assert len(per_task) and set(per_task["costs"]) == {"measured (this study)"}
    assert {"code", "chat"} <= set(per_task["task"]) and (per_task["optimal_gamma"] >= 1).all()
    # the method_family sweep runs on code only: its batch-1 rows are the per-task code rows here,
    # with the same predictions and the same measured speedups (so the same measured/predicted ratios)
    compared = 0
    for family in ("ngram", "layer_skip"):
        _, method_raw = tables.method_table(study, family)
        for _, m in method_raw[method_raw["batch_size"] == 1].iterrows():
            rows = per_task[
                (per_task["method"] == m["label"]) & (per_task["task"] == "code") & (per_task["gamma"] == m["gamma"])
            ]
            if not len(rows):  # no α̂ or costs for this row (nothing drafted): the report shows no prediction either
                assert not math.isfinite(m["predicted_speedup"])
                continue
            row = rows.iloc[0]
            assert row["predicted_speedup"] == pytest.approx(m["predicted_speedup"])
            assert row["measured_speedup"] == pytest.approx(m["speedup"])
            compared += 1
    assert compared >= 1
    pooled_tasks = predict_from_study(study, pool_tasks=True)
    assert set(pooled_tasks["task"]) == {"all"}


def test_prediction_for_another_profile_uses_its_roofline(report_study):
    h200 = load_hardware_profile("h200", measure=False)
    pred = predict_from_study(load(report_study), h200, target_params=7e9)
    assert len(pred) and all(c.startswith("roofline (h200") for c in pred["costs"])
    assert (pred["baseline_tokens_per_s"] > 100).all() and (pred["predicted_speedup"] > 0).all()
    assert pred["predicted_for"].unique().tolist() == ["h200"]


def test_cli_from_a_study(report_study, capsys):
    assert main(["predict", "--from", str(report_study), "--hardware", "a100", "--target-params", "7e9", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["prediction"] is True and doc["for"] == "a100" and doc["rows"]
    assert all(r["predicted_speedup"] is None or math.isfinite(r["predicted_speedup"]) for r in doc["rows"])
    assert main(["predict", "--from", str(report_study / "nope")]) == 2
    assert main(["predict", "--hardware", "a100"]) == 2
    assert "--target-params" in capsys.readouterr().err


def test_request_level_prediction_adds_prefill_and_the_draft_models_prompt_pass():
    """1 / (f (1 + d) + (1 − f) / s): the Qwen pair's llama.cpp code row (f 0.87, c 0.474, α̂ 1, γ 2,
    T(3)/T(1) 2.15) predicts the measured 0.72× only with the draft's prompt pass counted."""
    from specstudy import costmodel
    from specstudy.analysis.stats import predicted_speedup

    s = costmodel.speedup_with_verify_cost(1.0, 2, 0.474, 2.15)
    assert predicted_speedup(1.0, 2, 0.474, 2.15) == pytest.approx(s)
    no_draft = predicted_speedup(1.0, 2, 0.474, 2.15, prefill=0.87)
    with_draft = predicted_speedup(1.0, 2, 0.474, 2.15, prefill=0.87, draft_prefill=0.474)
    assert no_draft == pytest.approx(1 / (0.87 + 0.13 / s))
    assert with_draft == pytest.approx(1 / (0.87 * 1.474 + 0.13 / s)) and 0.69 < with_draft < 0.73
