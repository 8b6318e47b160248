"""A user's own task files: any name, anywhere, any category; prompts from JSONL, JSON, CSV, Parquet
or a ``datasets`` folder; and the check that lists every problem of a task file at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support import byte_tokenizer

from specstudy.cli import main as cli_main
from specstudy.config import ParamsError, load_task_config
from specstudy.config.task import seed_row
from specstudy.data.fetch import sha256_file
from specstudy.data.task_check import check_task
from specstudy.data.tasks import TaskDataError, load_requests, sha256_folder

ROWS = [{"key": f"k{i}", "body": f"Held-out question {i}?", "gold": f"answer {i}"} for i in range(6)]
FIELDS = {"id": "key", "text": "body", "reference": "gold"}


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTUDY_CACHE", str(tmp_path / "cache"))


def write_task(folder: Path, sources, name: str = "heldout", **top) -> Path:
    cfg = {"category": "heldout", "chat_template": False, "sources": sources, **top}
    p = folder / f"{name}.yaml"
    p.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return p


def source(path, sha: str, name: str = "mine", **extra):
    return {
        "name": name,
        "kind": "file",
        "path": str(path),
        "sha256": sha,
        "licence": "CC0 (mine)",
        "fields": FIELDS,
        **extra,
    }


def loaded(task: Path) -> list[tuple[str, str, str | None]]:
    return sorted((r.prompt_id, r.prompt, r.reference) for r in load_requests(str(task), n="all"))


EXPECTED = sorted((f"mine:k{i}", f"Held-out question {i}?", f"answer {i}") for i in range(6))


# --------------------------------------------------------------------------------------------
# formats, each with a field map


def test_jsonl_json_csv_and_parquet_files_load_through_a_field_map(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = {
        "jsonl": tmp_path / "p.jsonl",
        "json": tmp_path / "p.json",
        "csv": tmp_path / "p.csv",
        "parquet": tmp_path / "p.parquet",
    }
    files["jsonl"].write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    files["json"].write_text(json.dumps(ROWS))  # one JSON array
    files["csv"].write_text("key,body,gold\n" + "".join(f"{r['key']},{r['body']},{r['gold']}\n" for r in ROWS))
    pq.write_table(pa.Table.from_pylist(ROWS), files["parquet"])
    for fmt, path in files.items():
        task = write_task(tmp_path, [source(path, sha256_file(path))], name=f"t_{fmt}")
        assert loaded(task) == EXPECTED, fmt


def test_a_datasets_folder_loads_with_its_folder_pin(tmp_path):
    from datasets import Dataset, DatasetDict

    folder = tmp_path / "saved"
    Dataset.from_list(ROWS).save_to_disk(str(folder))
    pin = sha256_folder(folder)
    assert loaded(write_task(tmp_path, [source(folder, pin)])) == EXPECTED
    # the pin covers the rows, not the save: the same rows saved again keep it, other rows change it
    again = tmp_path / "again"
    Dataset.from_list(ROWS).save_to_disk(str(again))
    assert sha256_folder(again) == pin
    other = tmp_path / "other"
    Dataset.from_list(ROWS[:5]).save_to_disk(str(other))
    assert sha256_folder(other) != pin
    # a saved DatasetDict: split picks one
    dd = tmp_path / "dd"
    DatasetDict({"train": Dataset.from_list(ROWS[:2]), "test": Dataset.from_list(ROWS)}).save_to_disk(str(dd))
    assert loaded(write_task(tmp_path, [source(dd, sha256_folder(dd), split="test")], name="dd")) == EXPECTED
    with pytest.raises(TaskDataError, match="no split 'dev'") as e:
        load_requests(str(write_task(tmp_path, [source(dd, sha256_folder(dd), split="dev")], name="dd2")), n=1)
    assert e.value.key == "split" and e.value.allowed == ["test", "train"]


def test_a_folder_of_data_files_loads_them_all(tmp_path):
    folder = tmp_path / "parts"
    folder.mkdir()
    for k, chunk in enumerate((ROWS[:3], ROWS[3:])):
        (folder / f"part{k}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in chunk))
    assert loaded(write_task(tmp_path, [source(folder, sha256_folder(folder))])) == EXPECTED


def test_a_relative_path_starts_at_the_task_files_folder(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    task = write_task(tmp_path, [source("data/p.jsonl", sha256_file(data / "p.jsonl"))])
    assert loaded(task) == EXPECTED


def test_the_sha256_command_prints_the_pin(tmp_path, capsys):
    from datasets import Dataset

    folder = tmp_path / "saved"
    Dataset.from_list(ROWS).save_to_disk(str(folder))
    assert cli_main(["tasks", "sha256", str(folder)]) == 0
    assert capsys.readouterr().out.strip() == sha256_folder(folder)
    assert cli_main(["tasks", "sha256", str(tmp_path / "nope")]) == 2
    assert "an existing data file or folder" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# categories


def test_a_user_category_has_no_seed_row_and_a_seed_category_keeps_its_own(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    mine = load_task_config(write_task(tmp_path, [source(p, sha256_file(p))]))
    assert mine.category == "heldout" and seed_row(mine) == {}
    code_like = load_task_config(write_task(tmp_path, [source(p, sha256_file(p))], name="mycode", category="code"))
    assert seed_row(code_like) == dict(load_task_config("code").seed_reference)
    with pytest.raises(ParamsError) as e:
        load_task_config(write_task(tmp_path, [source(p, "0" * 64)], name="x", seed_reference={"entropy": "low"}))
    assert e.value.key == "seed_reference" and "code" in str(e.value.allowed)


# --------------------------------------------------------------------------------------------
# the check: every problem at once


def test_check_lists_every_problem_of_a_task_file(tmp_path):
    good = tmp_path / "good.jsonl"
    good.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:3]))
    nokey = tmp_path / "nokey.jsonl"
    nokey.write_text(json.dumps({"body": "no key here"}) + "\n")
    task = write_task(
        tmp_path,
        [
            source(tmp_path / "missing.jsonl", "0" * 64, name="gone"),
            source(good, "1" * 64, name="edited"),
            source(nokey, sha256_file(nokey), name="nokey"),
        ],
        colour="blue",
        sample={"n": 3, "size": 2},
    )
    found = check_task(task, need=5, need_text="prompts_per_task 4 + warmup.requests 1")
    by_key = {p.key: p for p in found.problems}
    assert set(by_key) == {
        "colour",
        "sample.size",
        "sources[0].path",
        "sources[1].sha256",
        "sources[2].fields.id",
    }, [str(p) for p in found.problems]
    assert all(str(task) in str(p) and "allowed" in str(p) for p in found.problems)
    assert "missing.jsonl" in str(by_key["sources[0].path"])
    assert by_key["sources[1].sha256"].value == "1" * 64 and sha256_file(good) in str(by_key["sources[1].sha256"])
    assert found.config is None and found.available is None  # not every source could be read


def test_check_counts_the_prompts_and_those_a_length_policy_keeps(tmp_path):
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps({**r, "body": r["body"] + " pad" * (20 * i)}) + "\n" for i, r in enumerate(ROWS)))
    plain = check_task(write_task(tmp_path, [source(p, sha256_file(p))]), need=5)
    assert plain.problems == [] and plain.available == 6
    banded = write_task(
        tmp_path, [source(p, sha256_file(p))], name="banded", input_length={"policy": "filter", "max_tokens": 120}
    )
    assert check_task(banded, need=5).problems == []  # without a tokenizer nothing is counted after the policy
    found = check_task(banded, need=5, need_text="what the study needs", tokenizers={"byte": byte_tokenizer()})
    (problem,) = found.problems
    assert problem.key == "input_length" and problem.value == "filter:0-120" and str(banded) in str(problem)
    assert ">= 5 of the 6 prompts (the study draws what the study needs)" in str(problem)
    assert "at most 2 prompts available after input_length filter:0-120 with byte's tokenizer" in str(problem)
    # fewer prompts than the study needs is the study's problem (check_tasks names its key), not the policy's:
    # the policy must keep what there is
    (short,) = check_task(banded, need=9, tokenizers={"byte": byte_tokenizer()}).problems
    assert ">= 6 of the 6 prompts" in str(short)
    wide = write_task(
        tmp_path, [source(p, sha256_file(p))], name="wide", input_length={"policy": "filter", "max_tokens": 10_000}
    )
    found = check_task(wide, need=9, tokenizers={"byte": byte_tokenizer()})
    assert found.problems == [] and found.available == 6
    assert check_task(banded, need=2, tokenizers={"byte": byte_tokenizer()}).problems == []
