"""llama.cpp rows beside the cost model's prediction from the engine's own measured costs."""

from __future__ import annotations

import copy

import pytest

from specstudy import costmodel
from specstudy.analysis import engine_costs, stats
from specstudy.analysis.drafts import pooled_drafts
from specstudy.analysis.study_records import load
from specstudy.report.sections import engine_costs_section, report_sections


def _as_llamacpp(study):
    """The tiny study's prompt-lookup cells relabelled as llama.cpp's, with a measured cost curve."""
    s = copy.deepcopy(study)
    for m in s.cells.values():
        if m["method"] in ("ngram", "ar"):
            m["framework"] = "llamacpp"
    model = next(iter(s.cells.values()))["model"]
    s.engine_costs = [
        {
            "framework": "llamacpp",
            "model": model,
            "drafter": None,
            "threads": 2,
            "c": None,
            "verify_ms": {"1": 10.0, "2": 17.7, "3": 24.0, "4": 31.2},
            "verify_ratio": {"1": 1.0, "2": 1.77, "3": 2.4, "4": 3.12},
            "load_average": {"before": [0.3, 0.2, 0.1]},
        }
    ]
    return s


def _row_of(m, r):
    keys = ("label", "task", "sampling", "gamma")
    return m["framework"] == "llamacpp" and m["batch_size"] == 1 and all(m[k] == r[k] for k in keys)


def test_no_costs_no_section(report_study):
    study = load(report_study)
    assert engine_costs.cost_curves(study).empty and engine_costs_section(study) is None


def test_rows_are_predicted_from_measured_alpha_hat_and_the_curve(report_study):
    s = _as_llamacpp(load(report_study))
    curve = engine_costs.cost_curves(s)
    assert list(curve["k"]) == [1, 2, 3, 4] and curve["verify_ratio"].iloc[-1] == 3.12
    rows = engine_costs.predicted_rows(s)
    assert len(rows) and set(rows["label"]) == {"Prompt lookup"}
    for _, r in rows.iterrows():
        v = {2: 1.77, 3: 2.4, 4: 3.12}[int(r["gamma"]) + 1]
        assert r["c"] == 0.0 and r["verify_ratio"] == v
        if not stats.isnum(r["alpha_hat"]):  # nothing drafted: every step an AR step (the lookup ≈ 0), so 1×
            assert r["predicted_speedup"] == pytest.approx(1.0)
            continue
        p = pooled_drafts(s, [c for c, m in s.cells.items() if _row_of(m, r)])
        mix = p.cost.draft_mix
        assert mix is not None  # the row is predicted from its measured draft lengths
        curve = {1: 1.77, 2: 2.4, 3: 3.12}  # a draft of k verifies k + 1 tokens: T(k+1)/T(1)
        steps = mix.steps_drafting(int(r["gamma"]))
        tokens = 1.0 + mix.draft_share * (mix.acceptance_length(int(r["gamma"])) - 1.0)
        cost = (1.0 - mix.draft_share) + sum(n * curve[k] for k, n in steps.items()) / mix.steps
        decode = tokens / cost
        f = r["prefill_share"]
        assert 0.0 < f < 1.0  # the tiny study's AR requests spend some of their E2E before the first token
        want = 1.0 / (f + (1.0 - f) / decode)
        assert r["predicted_speedup"] == pytest.approx(want)
        assert r["measured_over_predicted"] == pytest.approx(r["speedup"] / want)
        if mix.draft_share < 1.0:  # steps without a draft: below the model that drafts γ every step
            always = costmodel.speedup_with_verify_cost(min(max(r["alpha_hat"], 0), 1), int(r["gamma"]), 0.0, v)
            assert decode != pytest.approx(always)
    cids = [
        c
        for c, m in s.cells.items()
        if m["framework"] == "llamacpp"
        and m["method"] == "ngram"
        and m["batch_size"] == 1
        and m["task"] == rows["task"].iloc[0]
        and m["gamma"] == rows["gamma"].iloc[0]
        and m["sampling"] == rows["sampling"].iloc[0]
    ]
    assert rows["speedup"].iloc[0] == pytest.approx(stats.pooled(s, cids).paired.speedup)


def test_the_section_shows_the_curve_and_the_rows(report_study):
    s = _as_llamacpp(load(report_study))
    sec = engine_costs_section(s)
    assert sec is not None and "T(k)/T(1)" in sec.markdown and "3.12" in sec.markdown
    assert set(sec.tables) == {"engine_costs_curve", "engine_costs_rows"} and "engine_costs_curve" in sec.figures
    assert any(x.title.startswith("llama.cpp's own step costs") for x in report_sections(s))


def test_a_row_pooling_a_flagged_cell_is_marked(report_study):
    """Issue 36: flagged rows carry the mark in every table, the engine-cost rows included."""
    s = _as_llamacpp(load(report_study))
    rows = engine_costs.predicted_rows(s)
    flagged = rows["cells"].iloc[0][0]
    s.flags = {flagged: (("planted", False),)}
    shown, _ = engine_costs_section(s).tables["engine_costs_rows"]
    assert shown["label"].iloc[0].endswith(" ⚑") and "cells" not in shown
    assert not any(lab.endswith("⚑") for lab, cs in zip(shown["label"], rows["cells"]) if flagged not in cs)
