"""Predictions from a finished study's measured acceptance: for its own machine with its own measured
step costs (the report's cost-model column), and for another profile's roofline (labelled)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specstudy.analysis.predict_elsewhere import predict_from_study
from specstudy.analysis.study_records import load
from specstudy.cli import main
from specstudy.config import load_hardware_profile
from specstudy.config.vocab import method_family
from specstudy.records import RequestRecord, StepRecord, write_part
from specstudy.report import tables
from specstudy.report.predict_table import predict_table


def _predict(*args, **kwargs):
    """The predictions as the `predict` command shows them (costs and note in words)."""
    return predict_table(predict_from_study(*args, **kwargs))


def test_own_rows_predicted_from_own_acceptance_and_costs(report_study):
    study = load(report_study)
    per_task = _predict(study)
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
    pooled_tasks = _predict(study, pool_tasks=True)
    assert set(pooled_tasks["task"]) == {"all"}


def test_prediction_for_another_profile_uses_its_roofline(report_study):
    h200 = load_hardware_profile("h200", measure=False)
    pred = _predict(load(report_study), h200, target_params=7e9)
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


# ---- drafts that vary: synthetic studies with a known draft-length distribution

T1 = 0.010  # seconds per AR decode step
TTFT = 0.050


def _record(cell: str, pid: str, **kw) -> RequestRecord:
    base = dict(study="s", hardware="synthetic", task="code", prompt_id=pid, repeat=0, cell_id=cell, model="m")
    return RequestRecord(**{**base, "max_new_tokens": 64, "batch_size": 1, **kw})


def _ar(cell: str, pid: str, framework: str, n_tokens: int) -> RequestRecord:
    """An AR request: the prompt pass, then n − 1 decode steps of T1 each."""
    steps = [StepRecord(0, 0, 1, TTFT)] + [StepRecord(0, 0, 1, TTFT + T1 * (i + 1)) for i in range(n_tokens - 1)]
    whole = framework == "llamacpp"
    for st in steps[1:]:
        st.verify_s = None if whole else T1
    extra = {"llamacpp_forward_ms": [T1 * 1e3] * (n_tokens - 1)} if whole else {}
    rec = _record(
        cell,
        pid,
        framework=framework,
        method="ar",
        label="Baseline (AR)",
        family="ar",
        first_token_s=TTFT,
        end_s=TTFT + T1 * (n_tokens - 1),
        output_tokens=n_tokens,
        steps=steps,
        extra=extra,
    )
    return rec.fill_acceptance_from_steps()


def _spec(cell, pid, framework, method, label, gamma, plan, cost, c=0.0, drafter=None, ttft=TTFT):
    """A speculative request decoding ``plan`` [(drafted, accepted)], a step drafting k costing
    ``cost[k]`` × T1 (its verification; k = 0: a step without a draft) plus c·k × T1 of drafting."""
    whole, t, steps, fwd = framework == "llamacpp", ttft, [StepRecord(0, 0, 1, ttft)], []
    for k, a in plan:
        verify, draft = cost[k] * T1, c * k * T1
        t += verify + draft
        fwd.append((verify + draft) * 1e3)
        steps.append(StepRecord(k, a, a + 1, t, None if whole else draft, None if whole else verify))
    rec = _record(
        cell,
        pid,
        framework=framework,
        method=method,
        label=label,
        family=method_family(method),
        gamma=gamma,
        drafter=drafter,
        baseline_cell_id=f"ar-{framework}",
        first_token_s=ttft,
        end_s=t,
        output_tokens=1 + sum(a + 1 for _, a in plan),
        steps=steps,
        extra={"llamacpp_forward_ms": fwd} if whole else {},
    )
    return rec.fill_acceptance_from_steps()


#: per request, 10 decode steps: 7 find no n-gram (30 % draft), then drafts of 4, 4 and 2 tokens
#: accepting 4, 1 and 0: 15 decode tokens in 10 steps.  Costs × T1: no draft 1.0, k = 2 1.1, k = 4 1.2
LOOKUP_PLAN = [(0, 0)] * 3 + [(4, 4)] + [(0, 0)] * 2 + [(4, 1)] + [(0, 0)] * 2 + [(2, 0)]
LOOKUP_COST = {0: 1.0, 2: 1.1, 4: 1.2}


def _write_study(folder: Path, cells: dict[str, list[RequestRecord]]) -> Path:
    for cell, recs in cells.items():
        write_part(recs, folder / "records" / f"{cell}.parquet")
    return folder


def _lookup_study(folder: Path, ttft: float = TTFT, prompts: int = 4) -> Path:
    pids = [f"code/{i}" for i in range(prompts)]
    n = 1 + sum(a + 1 for _, a in LOOKUP_PLAN)
    return _write_study(
        folder,
        {
            "ar-llamacpp": [_ar("ar-llamacpp", p, "llamacpp", n) for p in pids],
            "lookup-g4": [
                _spec(
                    "lookup-g4",
                    p,
                    "llamacpp",
                    "ngram",
                    "Prompt lookup (one n-gram)",
                    4,
                    LOOKUP_PLAN,
                    LOOKUP_COST,
                    ttft=ttft,
                )
                for p in pids
            ],
        },
    )


def test_prediction_from_a_known_draft_mix_equals_the_hand_computed_value(tmp_path):
    """Tokens per decode step 15 / 10, cost per step (7 · 1.0 + 2 · 1.2 + 1.1) / 10 = 1.05 (× T1, c = 0:
    llama.cpp times drafting inside each forward); the AR baseline spends f = 50 ms of its 200 ms
    before the first token, so the request speeds up by 1 / (0.25 + 0.75 / (1.5 / 1.05))."""
    from specstudy.analysis.drafts import pooled_drafts
    from specstudy.analysis.stats import predicted_for

    study = load(_lookup_study(tmp_path / "cpu"))
    p = pooled_drafts(study, ["lookup-g4"])
    mix = p.cost.draft_mix
    assert mix is not None and (mix.decode_steps, mix.draft_steps, mix.gamma) == (40, 12, 4)
    assert (
        mix.c == 0.0 and dict(mix.verify_by_k) == pytest.approx({2: 1.1, 4: 1.2}) and mix.no_draft == pytest.approx(1)
    )
    assert p.cost.prefill_share == pytest.approx(0.25)
    want = 1 / (0.25 + 0.75 / (1.5 / 1.05))
    assert predicted_for(p, 4) == pytest.approx(want)
    assert p.paired.speedup == pytest.approx(want)  # the records' E2E are their timed steps: measured = predicted


def test_lookup_row_drafting_on_30_percent_of_steps_is_predicted_below_the_always_draft_model(tmp_path):
    from specstudy.analysis.drafts import pooled_drafts
    from specstudy.analysis.stats import predicted_for, predicted_speedup

    study = load(_lookup_study(tmp_path / "cpu"))
    p = pooled_drafts(study, ["lookup-g4"])
    always = predicted_speedup(p.acceptance.alpha_hat, 4, p.cost.c, p.cost.verify_ratio, p.cost.prefill_share)
    assert p.cost.draft_mix is not None and p.cost.draft_mix.draft_share == pytest.approx(0.3)
    assert predicted_for(p, 4) < 0.8 * always  # the old model: γ drafted every step, i.i.d. α̂ (5/7)
    table, raw = tables.method_table(study, "ngram")
    row = table.iloc[0]
    assert 0.9 <= float(row["measured/predicted"]) <= 1.1
    assert "drafts vary: 30% of steps draft, 3.3 tokens on average" in row["Model note"]


def test_a_row_outside_the_band_says_which_assumption_it_breaks(tmp_path):
    """The speculative prompt pass takes twice the AR one (the model takes them as equal)."""
    study = load(_lookup_study(tmp_path / "cpu", ttft=2 * TTFT))
    table, _ = tables.method_table(study, "ngram")
    row = table.iloc[0]
    assert float(row["measured/predicted"]) < 0.9
    assert "prompt pass 2.00× AR's (model: 1.00×)" in row["Model note"]


HEADS = "params/drafters/smollm2-135m-heads.safetensors"  # 4 heads


def _heads_study(folder: Path) -> Path:
    """Medusa-style heads run at γ = 3 (every step drafts 3; acceptance 0.9, 0.8, 0.7 of steps)."""
    plan = [(3, 3)] * 7 + [(3, 2)] + [(3, 1)] + [(3, 0)]
    cost = {0: 1.0, 3: 1.05}
    pids = [f"code/{i}" for i in range(4)]
    n = 1 + sum(a + 1 for _, a in plan)
    return _write_study(
        folder,
        {
            "ar-reference": [_ar("ar-reference", p, "reference", n) for p in pids],
            "heads-g3": [_spec("heads-g3", p, "reference", "heads", "Heads", 3, plan, cost, 0.02, HEADS) for p in pids],
        },
    )


def test_optimal_gamma_of_heads_stays_within_the_measured_depth_and_the_heads(tmp_path):
    from specstudy.analysis.drafts import draft_cap

    assert draft_cap("heads", HEADS) == (4, "heads") and draft_cap("ngram", None) == (None, "")
    study = load(_heads_study(tmp_path / "cpu"))
    h200 = load_hardware_profile("h200", measure=False)
    row = _predict(study, h200, target_params=7e9).iloc[0]
    assert row["optimal_gamma"] == 3 and row["searched_gamma_max"] == 3  # α̂ ≈ 0.9 alone would run to 16
    assert "measured draft depth" in row["note"] and "EXTRAPOLATED" not in row["note"]
    far = _predict(study, h200, target_params=7e9, extrapolate=True).iloc[0]
    assert far["searched_gamma_max"] == 4 and far["optimal_gamma"] == 4  # never past the 4 heads
    assert "optimal γ=4 EXTRAPOLATED past measured depth 3" in far["note"]
    _, task_raw = tables.task_table(study)
    assert "Heads: γ=3" in task_raw.iloc[0]["model_optimal_gamma"]
    assert "searched γ ≤ 3: the measured draft depth" in task_raw.iloc[0]["model_optimal_gamma"]


def test_cli_from_says_when_it_extrapolates(tmp_path, capsys):
    out = _lookup_study(tmp_path / "cpu")
    args = ["predict", "--from", str(out), "--hardware", "h200", "--target-params", "7e9", "--json"]
    assert main(args) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert rows and all(r["optimal_gamma"] <= 4 and "EXTRAPOLATED" not in r["note"] for r in rows)
    assert main([*args, "--extrapolate"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["extrapolate"] is True
    for r in doc["rows"]:  # prompt lookup has no cap of its own: searched to 16, labelled past 4
        assert r["searched_gamma_max"] == 16
        assert ("EXTRAPOLATED past measured depth 4" in r["note"]) == (r["optimal_gamma"] > 4)
    assert main(args[:-1] + ["--extrapolate"]) == 0
    text = capsys.readouterr().out
    assert "γ searched past the measured draft depth" in text and "note" in text
