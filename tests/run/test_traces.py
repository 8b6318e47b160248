"""Trace replay: Mooncake/AIPerf and vLLM custom-dataset lines read and checked (every bad line at
once), hash blocks filled with the target's tokens, a sweep's trace cells beside Poisson cells at the
trace's mean rate, and, marked slow, the recorded schedule replayed against a kit-started llama.cpp
server with the send lag measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import byte_tokenizer, run_study_file, write_study_file, write_task

from specstudy.analysis import rates
from specstudy.analysis.study_records import load as load_outputs
from specstudy.config import ParamsError, load_study
from specstudy.config.errors import ParamsProblems
from specstudy.config.task import load_task_config
from specstudy.data.fetch import sha256_file
from specstudy.data.task_check import check_task
from specstudy.data.tasks import load_requests
from specstudy.data.traces import mean_rate
from specstudy.run.plan import check_backends, expand

TEXTS = [
    {"id": f"t{i}", "text": f"Paragraph {i}: the river path opens in spring, the council said. " * 3} for i in range(3)
]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTUDY_CACHE", str(tmp_path / "cache"))


def trace_task(folder: Path, lines, fmt: str = "mooncake", time_scale: float = 1.0, block_size: int = 512) -> Path:
    trace = folder / "trace.jsonl"
    trace.write_text("".join((json.dumps(x) if not isinstance(x, str) else x) + "\n" for x in lines))
    spec = {"path": "trace.jsonl", "sha256": sha256_file(trace), "format": fmt, "time_scale": time_scale}
    return write_task(
        folder,
        TEXTS,
        {"id": "id", "text": "text"},
        name="replay",
        category="trace",
        trace={**spec, "block_size": block_size},
    )


MOONCAKE = [
    {"timestamp": 1000, "input_length": 20, "output_length": 4, "hash_ids": [7, 8]},
    {"timestamp": 1500, "input_length": 14, "output_length": 6, "hash_ids": [7, 9]},
    {"timestamp": 3000, "input_length": 5, "output_length": 3, "hash_ids": [2]},
]


def test_mooncake_lines_become_requests_with_shared_hash_blocks_and_scaled_arrivals(tmp_path):
    tok = byte_tokenizer()
    task = trace_task(tmp_path, MOONCAKE, time_scale=0.5, block_size=10)
    reqs = load_requests(load_task_config(task), n=3, tokenizer=tok)
    assert [len(r.prompt_ids) for r in reqs] == [20, 14, 5]  # the last block holds the remainder
    assert reqs[0].prompt_ids[:10] == reqs[1].prompt_ids[:10]  # hash id 7: the same block
    assert reqs[0].prompt_ids[10:] != reqs[1].prompt_ids[10:14]
    assert [r.arrival_s for r in reqs] == [0.0, 0.25, 1.0] and [r.max_new_tokens for r in reqs] == [4, 6, 3]
    corpus = tok("\n\n".join(r["text"] for r in TEXTS), add_special_tokens=False)["input_ids"]
    text = tok.decode(list(reqs[0].prompt_ids))
    assert text.replace("\n", "") and all(i in corpus for i in reqs[0].prompt_ids)  # real text, not random ids
    assert mean_rate([r.arrival_s for r in reqs]) == pytest.approx(2.0)


def test_vllm_custom_lines_keep_their_prompts_and_output_tokens(tmp_path):
    lines = [{"timestamp": 0, "prompt": "Say hi.", "output_tokens": 5}, {"timestamp": 250, "prompt": "Say bye."}]
    reqs = load_requests(load_task_config(trace_task(tmp_path, lines, fmt="vllm_custom")), n=2)
    assert [(r.prompt, r.max_new_tokens, r.arrival_s, r.prompt_ids) for r in reqs] == [
        ("Say hi.", 5, 0.0, None),
        ("Say bye.", None, 0.25, None),
    ]


def test_every_bad_trace_line_is_listed_at_once_naming_line_key_and_allowed(tmp_path):
    lines = [
        MOONCAKE[0],
        {"timestamp": -1, "input_length": 2000, "output_length": 0, "hash_ids": [1]},
        {"timestamp": 10, "input_length": 3, "hash_ids": [1], "session_id": "s1"},
        "not json",
    ]
    check = check_task(trace_task(tmp_path, lines, block_size=10))
    keys = [p.key for p in check.problems]
    assert keys == [
        "trace line 2: timestamp",
        "trace line 2: output_length",
        "trace line 2: input_length",
        "trace line 3: session_id",
        "trace line 4",
    ], keys
    bad = check.problems[2]
    assert (
        bad.value == 2000
        and "1..10 for 1 hash_ids of block_size 10" in str(bad.allowed)
        and str(tmp_path) in str(bad.file)
    )
    with pytest.raises(ParamsProblems):
        load_requests(load_task_config(trace_task(tmp_path, lines, block_size=10)), n=1, tokenizer=byte_tokenizer())


def test_a_stale_trace_pin_is_a_problem_of_the_trace_key(tmp_path):
    task = trace_task(tmp_path, MOONCAKE, block_size=10)
    (tmp_path / "trace.jsonl").write_text(json.dumps(MOONCAKE[0]) + "\n")
    assert [p.key for p in check_task(task).problems] == ["trace.sha256"]


def study_yaml(folder: Path, task: Path, frameworks=("llamacpp",), **sweep) -> Path:
    keys = {"batch_sizes": [4], "prompts_per_task": 2, "arrivals": ["trace", "poisson"], **sweep}
    return write_study_file(folder, [task], frameworks, dtype="float32", telemetry_period_s=0.5, **keys)


def test_a_trace_sweep_pairs_trace_and_poisson_cells_at_the_traces_mean_rate(tmp_path):
    task = trace_task(tmp_path, MOONCAKE, block_size=10)
    cfg = check_backends(load_study("cpu", study_yaml(tmp_path, task)), files=False)
    plans = expand(cfg)
    assert sorted((p.cell.method, p.arrivals) for p in plans) == [
        ("ar", "poisson"),
        ("ar", "trace"),
        ("ngram", "poisson"),
        ("ngram", "trace"),
    ]
    assert {p.request_rate for p in plans} == {2.0}  # two requests 0.5 s apart
    for p in plans:
        if p.baseline_cell_id:
            base = next(q for q in plans if q.cell_id == p.baseline_cell_id)
            assert base.arrivals == p.arrivals  # each pairs with the AR run of the same arrivals


def test_trace_arrivals_are_refused_with_rates_offline_engines_or_a_task_without_a_trace(tmp_path):
    task = trace_task(tmp_path, MOONCAKE, block_size=10)
    with pytest.raises(ParamsError) as e:
        load_study("cpu", study_yaml(tmp_path, task, request_rates=[1.0]))
    assert e.value.key == "study.request_rates" and "arrivals: trace" in str(e.value.allowed)
    with pytest.raises(ParamsError) as e:
        check_backends(load_study("cpu", study_yaml(tmp_path, task, frameworks=["reference"])), files=False)
    assert e.value.key == "study.frameworks" and e.value.value == ["reference"]
    with pytest.raises(ParamsError) as e:
        check_backends(load_study("cpu", study_yaml(tmp_path, "code")), files=False)
    assert e.value.key == "trace" and "task 'code'" in e.value.hint


@pytest.mark.slow
def test_llamacpp_receives_the_trace_at_its_recorded_times_beside_poisson_at_the_same_rate(tmp_path):
    lines = [
        {"timestamp": 0, "prompt": "List three colours.", "output_tokens": 6},
        {"timestamp": 100, "prompt": "Name a river.", "output_tokens": 4},
        {"timestamp": 900, "prompt": "Count to five.", "output_tokens": 8},
        {"timestamp": 1000, "prompt": "Say hello.", "output_tokens": 5},
        {"timestamp": 2600, "prompt": "Name a tree.", "output_tokens": 6},
    ]
    task = trace_task(tmp_path, lines, fmt="vllm_custom", time_scale=0.5)
    res, recs, out = run_study_file(study_yaml(tmp_path, task, prompts_per_task=4), check=True)
    assert all(r.status == "done" for r in res if r.cell_id != "engine_costs"), [r.message for r in res]
    assert all(r.status == "ok" for r in recs), [r.error for r in recs]
    trace = sorted((r for r in recs if r.method == "ar" and r.extra["arrivals"] == "trace"), key=lambda r: r.prompt_id)
    assert [r.scheduled_send_s for r in trace] == pytest.approx([0.0, 0.05, 0.45, 0.5])  # time_scale 0.5
    assert [r.output_tokens for r in trace] == [6, 4, 8, 5]  # each line's own output length
    # never early, and in the trace's order; how late (the 5 ms target) is bench/send_schedule.py's
    # measure on a quiet machine, not a test's: a busy machine delays sends by tens of ms
    assert all(r.sent_s >= r.scheduled_send_s for r in trace), [r.sent_s - r.scheduled_send_s for r in trace]
    assert [r.prompt_id for r in sorted(trace, key=lambda r: r.sent_s)] == [
        r.prompt_id for r in sorted(trace, key=lambda r: r.scheduled_send_s)
    ]
    poisson = [r for r in recs if r.method == "ar" and r.extra["arrivals"] == "poisson"]
    assert len(poisson) == 4 and [r.scheduled_send_s for r in sorted(poisson, key=lambda r: r.prompt_id)] != [
        r.scheduled_send_s for r in trace
    ]
    assert all(r.request_rate == pytest.approx(3 / 0.5) for r in recs)  # the trace slice: 3 gaps in 0.5 s
    raw = rates.trace_frame(rates.rate_frame(load_outputs(out)))
    assert sorted(zip(raw["method"], raw["arrivals"])) == [
        ("ar", "poisson"),
        ("ar", "trace"),
        ("ngram", "poisson"),
        ("ngram", "trace"),
    ]
    assert (raw["send_lag_max_ms"] >= 0).all() and raw["send_lag_max_ms"].notna().all()
