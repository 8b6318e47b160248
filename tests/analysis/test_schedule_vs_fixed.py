"""The engines' own γ schedules against the best fixed γ per load, on records made to sit on either side."""

from __future__ import annotations

import math

from specstudy.analysis import schedule_vs_fixed
from specstudy.analysis.study_records import _describe
from specstudy.frameworks import DECLARATIONS
from specstudy.frameworks.declaration import engine_schedule
from specstudy.report import deploy

from .test_deploy import rec, study_of

SCHEDULE = ("gamma_per_batch", "1-4:3,5-64:1")


def _cells(out, name, *, speedup, gamma, batch=1, rate=None, schedule=False, prompts=8):
    """A speculative cell (its paired AR made once per load) whose prompts run ``speedup`` × faster than
    AR, with a ±5 % spread over prompts; ``schedule``: its plan set vLLM's own γ per batch size."""
    ar = f"ar-b{batch}-r{rate}"
    for i in range(prompts):
        if not any(r.cell_id == ar and r.prompt_id == f"code/{i}" for r in out):
            out.append(rec(ar, framework="vllm", method="ar", label="AR", batch=batch, rate=rate, prompt=i))
        noise = 1.0 + 0.05 * ((i * 7) % 5 - 2) / 2
        out.append(
            rec(
                name,
                framework="vllm",
                method="eagle3",
                label="EAGLE-3 (vLLM γ per batch size)" if schedule else "EAGLE-3",
                gamma=gamma,
                batch=batch,
                rate=rate,
                base=ar,
                prompt=i,
                tpot=0.02 * noise / speedup,
                ttft=0.05 * noise / speedup,
            )
        )
    return {"cell": {"options": [list(SCHEDULE)]}} if schedule else None


def _study():
    out: list = []
    plans = {
        "s-b1": _cells(out, "s-b1", speedup=1.62, gamma=3, schedule=True),
        "s-b16": _cells(out, "s-b16", speedup=1.6, gamma=3, batch=16, schedule=True),
        "s-r8": _cells(out, "s-r8", speedup=1.3, gamma=3, rate=8.0, schedule=True),
    }
    _cells(out, "f1-b1", speedup=1.2, gamma=1)
    _cells(out, "f3-b1", speedup=1.6, gamma=3)
    _cells(out, "f1-b16", speedup=1.05, gamma=1, batch=16)
    _cells(out, "f3-b16", speedup=0.8, gamma=3, batch=16)
    study = study_of(out)
    for cid, plan in plans.items():
        study.cells[cid] = _describe(cid, study.records[cid], plan)
    return study


def test_each_engine_declares_which_option_is_its_own_schedule():
    assert engine_schedule(DECLARATIONS["vllm"], dict([SCHEDULE])) == "gamma_per_batch=1-4:3,5-64:1"
    assert engine_schedule(DECLARATIONS["vllm"], {}) is None
    assert engine_schedule(DECLARATIONS["sglang"], {"adaptive_steps": True}) == "adaptive_steps=True"
    assert engine_schedule(DECLARATIONS["sglang"], {"adaptive_steps": False}) is None
    assert engine_schedule(DECLARATIONS["hf"], {"assistant_schedule": "heuristic"}) == "assistant_schedule=heuristic"
    assert engine_schedule(DECLARATIONS["hf"], {"assistant_schedule": "constant"}) is None  # HF's fixed γ
    assert engine_schedule(DECLARATIONS["trtllm"], dict([SCHEDULE])) is not None


def _by_load(frame):
    return frame.assign(load=[deploy.load_text(b, r) for b, r in zip(frame["batch_size"], frame["request_rate"])])


def test_schedule_beside_the_best_fixed_gamma_per_load_with_a_verdict():
    frame = _by_load(schedule_vs_fixed.schedule_vs_fixed(_study())).set_index("load")
    assert sorted(frame.index) == ["8 req/s", "batch 1", "batch 16"]
    one = frame.loc["batch 1"]
    assert one["best_gamma"] == 3 and one["fixed_gammas"] == [1, 3]
    assert one["verdict"] == schedule_vs_fixed.CANNOT_SEPARATE  # 1.62 against 1.60: the intervals overlap
    sixteen = frame.loc["batch 16"]
    assert sixteen["best_gamma"] == 1 and sixteen["verdict"] == schedule_vs_fixed.SCHEDULE_AHEAD  # 1.6 against 1.05
    assert sixteen["schedule_ci"][0] > sixteen["best_ci"][1]
    rate = frame.loc["8 req/s"]
    assert rate["verdict"] == schedule_vs_fixed.NO_FIXED and math.isnan(rate["best_speedup"])
    # the schedule's cells, the best fixed γ's and their paired AR
    assert sorted(one["rests_on"]) == ["ar-b1-rNone", "f3-b1", "s-b1"]


def test_fixed_gamma_ahead_of_the_schedule_is_named():
    out: list = []
    plan = _cells(out, "s", speedup=1.1, gamma=3, schedule=True)
    _cells(out, "f2", speedup=1.7, gamma=2)
    study = study_of(out)
    study.cells["s"] = _describe("s", study.records["s"], plan)
    frame = schedule_vs_fixed.schedule_vs_fixed(study)
    assert frame["verdict"].tolist() == [schedule_vs_fixed.FIXED_AHEAD]
    assert deploy.schedule_verdict_text(frame["verdict"][0], int(frame["best_gamma"][0])) == "fixed γ 2 ahead"


def test_the_report_shows_the_table_only_when_a_schedule_ran():
    sec = deploy.deploy_section(_study())
    assert "### The engine's schedule vs the best fixed γ per load" in sec.markdown
    shown, _ = sec.tables["deploy_engine_schedule"]
    assert set(shown["Verdict"]) == {"cannot separate", "schedule ahead", "no fixed γ measured at this load"}
    out: list = []
    _cells(out, "f1", speedup=1.2, gamma=1)
    _cells(out, "f3", speedup=1.6, gamma=3)
    assert "engine's schedule" not in deploy.deploy_section(study_of(out)).markdown
