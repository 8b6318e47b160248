"""Conversations replayed turn by turn: records carry the turn, turn k + 1's history is the AR
baseline's own answer to turn k for the baseline and its speculative cells alike, and the report
gives α, AL and speedup per turn.  End to end on the reference engine's tiny model and, marked
slow, through a kit-started llama.cpp server with its prompt cache on."""

from __future__ import annotations

from pathlib import Path

import pytest
from support import LLAMACPP, ByteIds, TinyFactory, byte_tokenizer, run_study_file, write_study_file, write_task

from specstudy import metrics
from specstudy.analysis import turns as turn_analysis
from specstudy.analysis.study_records import load as load_outputs
from specstudy.backends.base import Backend
from specstudy.config import load_study
from specstudy.config.task import load_task_config
from specstudy.data.conversations import next_turn
from specstudy.data.tasks import TaskDataError, load_requests
from specstudy.records import RequestRecord
from specstudy.report.workload import conversations_section
from specstudy.run.cell import CellRun
from specstudy.run.conversation_cells import run_turns
from specstudy.run.plan import expand, plan_summary


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTUDY_CACHE", str(tmp_path / "cache"))


def conversation(i: int) -> dict:
    return {
        "cid": f"c{i}",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"List three colours, set {i}."},
            {"role": "assistant", "content": "the dataset's own answer, never sent"},
            {"role": "user", "content": f"Now the same colours in reverse order, set {i}."},
        ],
    }


def task_file(folder: Path, rows, turns="all", chat_template=False) -> Path:
    return write_task(
        folder, rows, {"id": "cid", "text": "messages"}, name="talk", turns=turns, chat_template=chat_template
    )


def test_role_content_messages_become_user_turns_with_the_record_system_message(tmp_path):
    task = task_file(tmp_path, [conversation(i) for i in range(3)])
    reqs = load_requests(load_task_config(task), n=3)
    r = next(q for q in reqs if q.prompt_id == "talk:c1")
    assert r.prompt == "Be brief.\n\nList three colours, set 1." and r.turn == 1
    assert r.later_turns == ("Now the same colours in reverse order, set 1.",)
    first_only = load_requests(load_task_config(task_file(tmp_path, [conversation(0)], turns=1)), n=1)
    assert first_only[0].later_turns == ()


def test_a_message_without_a_known_role_is_refused_naming_the_field(tmp_path):
    bad = conversation(0)
    bad["messages"][1] = {"speaker": "user", "content": "hi"}
    task = task_file(tmp_path, [bad])
    with pytest.raises(TaskDataError) as e:
        load_requests(load_task_config(task), n=1)
    assert e.value.key == "fields.text" and "message 1" in str(e.value) and "role" in str(e.value)


def test_next_turn_renders_the_chat_template_over_the_history_with_the_given_answer(tmp_path):
    tok = byte_tokenizer()
    task = task_file(tmp_path, [conversation(0)], chat_template=True)
    (r,) = load_requests(load_task_config(task), n=1, tokenizer=tok)
    nxt = next_turn(r, "red, green, blue", tok)
    assert nxt.turn == 2 and nxt.later_turns == ()
    assert nxt.messages == (
        ("system", "Be brief."),
        ("user", "List three colours, set 0."),
        ("assistant", "red, green, blue"),
        ("user", "Now the same colours in reverse order, set 0."),
    )
    assert nxt.prompt.startswith(r.prompt) and "red, green, blue<|im_end|>" in nxt.prompt
    assert nxt.prompt.endswith("<|im_start|>assistant\n")
    assert list(nxt.prompt_ids) == tok(nxt.prompt, add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match="last"):
        next_turn(nxt, "x", tok)


class Echo(Backend):
    """Answers every request with its method's name and the turn; keeps what it was sent."""

    framework = "reference"

    def __init__(self):
        self.sent: list[tuple[str, str, int]] = []

    def run(self, requests, sampling, cell):
        for r in requests:
            self.sent.append((cell.method, r.prompt, r.turn))
            rec = cell.new_record(r, sampling, output_text=f"<{cell.method} answer {r.turn}>", end_s=1.0)
            rec.first_token_s = 0.5
            yield rec


def study_yaml(folder: Path, task: Path, prompts: int = 5) -> Path:
    ngram = {"method": "ngram", "label": "Prompt lookup", "options": {"ngram_min": 1}}
    return write_study_file(
        folder, [task], methods=[{"method": "ar"}, ngram], max_new_tokens=6, prompts_per_task=prompts
    )


def test_every_turn_after_the_first_is_built_from_the_baselines_answers(tmp_path):
    task = task_file(tmp_path, [conversation(i) for i in range(3)])
    cfg = load_study("cpu", study_yaml(tmp_path, task, prompts=2))
    base, spec = expand(cfg)
    assert base.turns == spec.turns == 2 and plan_summary([base, spec])["requests"] == 8  # a dry run counts turns
    reqs = load_requests(load_task_config(task), n=2)
    echo = Echo()
    ar, _ = run_turns(CellRun(base, echo, reqs, [], 2, 0.05, False), history=None, tokenizer=None)
    ng, _ = run_turns(CellRun(spec, echo, reqs, [], 2, 0.05, False), history=ar, tokenizer=None)
    assert (
        sorted((r.method, r.turn) for r in ar + ng)
        == [("ar", 1)] * 2 + [("ar", 2)] * 2 + [("ngram", 1)] * 2 + [("ngram", 2)] * 2
    )
    second = [(m, p) for m, p, t in echo.sent if t == 2]
    assert len(second) == 4
    for method, prompt in second:  # the history is AR's answer for both cells, never the dataset's
        assert "<ar answer 1>" in prompt and "<ngram answer 1>" not in prompt and "never sent" not in prompt, method
    assert {p for m, p in second if m == "ar"} == {p for m, p in second if m == "ngram"}
    assert len(metrics.paired_records(ar, ng)) == 4  # pairs are matched turn by turn


def test_a_conversation_task_runs_turn_by_turn_in_a_study_with_per_turn_alpha_and_speedup(tmp_path):
    task = task_file(tmp_path, [conversation(i) for i in range(6)])
    res, recs, out = run_study_file(study_yaml(tmp_path, task), TinyFactory(tokenizer=ByteIds()))
    assert [r.status for r in res] == ["done", "done"], [r.message for r in res]
    by = {(r.method, r.prompt_id, r.turn): r for r in recs}
    assert len(recs) == 2 * 5 * 2 and {r.turn for r in recs} == {1, 2}
    tok = ByteIds()
    for (method, pid, turn), r in by.items():
        if turn != 2:
            continue
        ar1, ar2 = by[("ar", pid, 1)], by[("ar", pid, 2)]
        # the engine's own greedy answer to turn 1 is in turn 2's prompt, for the speculative cell too
        n = pid[-1]
        turn1 = f"Be brief.\n\nList three colours, set {n}."
        prompt2 = f"{turn1}{ar1.output_text}\n\nNow the same colours in reverse order, set {n}."
        assert r.input_tokens == len(tok(prompt2)["input_ids"]) == ar2.input_tokens, (method, pid)
        assert r.output_ids == ar2.output_ids  # greedy and lossless: the same answer at every turn
    study = load_outputs(out)
    raw = turn_analysis.turn_frame(study)
    assert list(raw["turn"]) == [1, 2] and list(raw["n_prompts"]) == [5, 5]
    for turn, row in zip((1, 2), raw.itertuples()):
        spec = [r for r in recs if r.method == "ngram" and r.turn == turn]
        acc = metrics.acceptance_summary(spec)
        assert row.alpha == pytest.approx(acc["alpha"], nan_ok=True)
        assert row.al == pytest.approx(acc["acceptance_length"], nan_ok=True)
        sp = metrics.paired_speedup([r for r in recs if r.method == "ar" and r.turn == turn], spec)
        assert row.speedup == pytest.approx(sp["speedup"]) and sp["n_prompts"] == 5
    assert raw["alpha"].iloc[1] == raw["alpha"].iloc[1]  # turn 2's history gives the n-gram drafter something
    sec = conversations_section(study)
    assert sec is not None and "conversation_turns" in sec.tables and "| 2 |" in sec.markdown


def test_records_written_before_turns_read_back_as_turn_one(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from specstudy.records import read_part

    rec = RequestRecord("s", "cpu", "reference", "ar", "code", "p0", 0, "c", "m")
    table = pa.Table.from_pylist([{k: v for k, v in rec.__dict__.items() if k not in ("turn", "steps", "extra")}])
    pq.write_table(table, tmp_path / "old.parquet")
    assert read_part(tmp_path / "old.parquet")[0].turn == 1


@pytest.mark.slow
def test_llamacpp_replays_conversations_with_its_own_answers_and_cache_hits_per_turn(tmp_path):
    task = task_file(tmp_path, [conversation(i) for i in range(4)], chat_template=True)
    path = write_study_file(
        tmp_path,
        [task],
        prefix_cache=[True],
        warmup={"requests": 1, "max_new_tokens": 4},
        max_new_tokens=12,
        prompts_per_task=3,
        **LLAMACPP,
    )
    res, recs, out = run_study_file(path)
    assert [r.status for r in res if r.cell_id != "engine_costs"] == ["done", "done"], [r.message for r in res]
    by = {(r.method, r.prompt_id, r.turn): r for r in recs}
    assert len(recs) == 2 * 3 * 2 and all(r.status == "ok" for r in recs), [r.error for r in recs]
    for (_method, pid, turn), r in by.items():
        t = r.extra["llamacpp_timings"]
        assert t["cache_n"] + t["prompt_n"] == r.input_tokens  # llama.cpp's own prompt accounting
        if turn == 2:  # turn 2's prompt holds turn 1 and the AR answer: the same input for both cells
            assert r.input_tokens == by[("ar", pid, 2)].input_tokens > by[("ar", pid, 1)].input_tokens
    raw = turn_analysis.turn_frame(load_outputs(out))
    assert list(raw["turn"]) == [1, 2] and list(raw["n_prompts"]) == [3, 3]
    assert all(0.0 <= h <= 1.0 for h in raw["hit_rate"]), raw["hit_rate"]
    assert "cache_n" in raw["hit_source"].iloc[0]


def test_a_turns_hit_rate_sums_each_cells_run_counters_of_that_turn():
    """vLLM's prefix-cache counters are run-level (every record of a run carries the same block): a
    turn's hit rate sums them once per cell, never once per request."""
    from specstudy.analysis.turns import turn_hit_rate

    def rec(cell, hits, queries):
        r = RequestRecord("s", "cpu", "vllm-server", "ar", "talk", f"p-{cell}-{hits}", 0, cell, "m", turn=2)
        r.extra["prefix_cache_counters"] = {"hits": hits, "queries": queries, "source": "vllm counters"}
        return r

    records = [rec("a", 30, 100), rec("a", 30, 100), rec("b", 10, 50)]
    assert turn_hit_rate(records) == (pytest.approx(40 / 150), "vllm counters")
    assert turn_hit_rate([RequestRecord("s", "cpu", "x", "ar", "t", "p", 0, "c", "m")]) == (None, "")
