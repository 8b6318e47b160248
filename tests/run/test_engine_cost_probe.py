"""The engine cost step of a study: which llama.cpp pairs it measures, once, and how it fails."""

from __future__ import annotations

import pytest

from specstudy.config import ParamsError, load_study
from specstudy.layout import StudyLayout
from specstudy.run import engine_cost_probe
from specstudy.run.plan import expand


def test_pairs_of_the_shipped_profiles():
    assert engine_cost_probe.llamacpp_pairs(expand(load_study("cpu-pair"))) == [
        ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b")
    ]
    assert engine_cost_probe.llamacpp_pairs(expand(load_study("cpu"))) == [("smollm2-135m", None)]
    assert load_study("cpu-pair").engine_costs == ("llamacpp",) and load_study("cpu").engine_costs == ()


def test_measured_once_and_a_failure_is_retried(monkeypatch, tmp_path):
    cfg = load_study("cpu-pair")
    plans = expand(cfg)
    calls = []

    def measure(model, drafter, *, threads, ks, repeats, log_dir):  # stands in for llama.cpp here
        calls.append((model, drafter, threads, list(ks)))
        if len(calls) == 1:
            raise RuntimeError("server never became ready")
        return {"model": model, "drafter": drafter, "verify_ratio": {1: 1.0, 7: 5.1}, "c": 0.4}

    monkeypatch.setattr(engine_cost_probe, "measure_costs", measure)
    layout, said = StudyLayout(tmp_path), []
    problems = engine_cost_probe.measure_engine_costs(cfg, plans, layout, said.append)
    assert len(problems) == 1 and "server never became ready" in problems[0] and not layout.read_engine_costs()
    assert engine_cost_probe.measure_engine_costs(cfg, plans, layout, said.append) == []
    # γ 2, 4, 6: T(1) and T(γ+1) (what each row's prediction needs); the study's llama.cpp threads
    assert calls[-1] == ("qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b", 2, [1, 3, 5, 7])
    (doc,) = layout.read_engine_costs()
    assert doc["framework"] == "llamacpp" and doc["c"] == 0.4
    engine_cost_probe.measure_engine_costs(cfg, plans, layout, said.append)
    assert len(calls) == 2  # done: not measured again


def test_a_bad_costs_file_is_named(tmp_path):
    layout = StudyLayout(tmp_path)
    path = layout.write_engine_costs("llamacpp", "m", None, {"c": None})
    path.write_text("{trunc")
    with pytest.raises(Exception, match=str(path)):
        layout.read_engine_costs()


def test_costs_for_an_engine_the_study_does_not_run_are_refused(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(
        "study:\n  models: [{name: s, target: smollm2-135m}]\n  methods: [{method: ar}]\n"
        "  frameworks: [reference]\n  tasks: [code]\n  engine_costs: [llamacpp]\n"
    )
    with pytest.raises(ParamsError) as e:
        load_study("cpu", p)
    assert e.value.key == "study.engine_costs" and e.value.value == "llamacpp"
