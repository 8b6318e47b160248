"""A study on a user's own task file (outside the repository, a new category) runs end to end on the
tiny model, and a bad task file fails before any engine loads or installs, listing every problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from support import ByteIds, TinyFactory

from specstudy.analysis.study_records import load as load_outputs
from specstudy.cli import main as cli_main
from specstudy.config import ParamsError, load_study
from specstudy.config.errors import ParamsProblems
from specstudy.data.fetch import sha256_file
from specstudy.data.tasks import sha256_folder
from specstudy.layout import StudyLayout
from specstudy.report.tables import seed_reference, task_table
from specstudy.run.plan import expand
from specstudy.run.study_runner import run_study

ROWS = [{"qid": f"h{i}", "q": f"Name a colour, number {i}."} for i in range(4)]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTUDY_CACHE", str(tmp_path / "cache"))


def study_yaml(folder: Path, tasks, prompts: int = 3, warmup: int = 1) -> Path:
    study = {
        "name": "mine",
        "models": [{"name": "tiny", "target": "smollm2-135m", "dtype": "float64"}],
        "methods": [{"method": "ar"}, {"method": "ngram", "label": "Prompt lookup", "options": {"ngram_min": 1}}],
        "frameworks": ["reference"],
        "tasks": tasks,
        "gammas": [2],
        "batch_sizes": [1],
        "warmup": {"requests": warmup, "max_new_tokens": 2},
        "max_new_tokens": 4,
        "prompts_per_task": prompts,
        "telemetry_period_s": 0.05,
    }
    p = folder / "study.yaml"
    p.write_text(yaml.safe_dump({"study": study}, sort_keys=False))
    return p


def task_yaml(folder: Path, path, sha: str, name: str = "heldout", **top) -> Path:
    src = {"name": "mine", "kind": "file", "path": str(path), "sha256": sha, "licence": "CC0 (mine)"}
    cfg = {
        "category": "heldout",
        "chat_template": False,  # the tiny model's stand-in tokenizer has no chat template
        "sources": [{**src, "fields": {"id": "qid", "text": "q"}}],
        **top,
    }
    p = folder / f"{name}.yaml"
    p.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return p


def run(cfg, out: Path, factory):
    return run_study(cfg, expand(cfg), StudyLayout(out), factory=factory, progress=False, log=lambda m: None)


def jsonl(tmp_path: Path) -> tuple[Path, str]:
    p = tmp_path / "mine.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return p, sha256_file(p)


def saved_dataset(tmp_path: Path) -> tuple[Path, str]:
    from datasets import Dataset

    folder = tmp_path / "mine_ds"
    Dataset.from_list(ROWS).save_to_disk(str(folder))
    return folder, sha256_folder(folder)


@pytest.mark.parametrize("data", [jsonl, saved_dataset], ids=["jsonl", "datasets-folder"])
def test_a_task_file_outside_the_repository_runs_in_a_tiny_study(tmp_path, data):
    tasks_dir = tmp_path / "elsewhere"
    tasks_dir.mkdir()
    task = task_yaml(tasks_dir, *data(tmp_path))
    # named relative to the study file's folder
    cfg = load_study("cpu", study_yaml(tmp_path, ["elsewhere/heldout.yaml"]))
    assert [sw.tasks for sw in cfg.sweeps] == [("heldout",)] and cfg.task_files == {"heldout": str(task)}
    out = tmp_path / "outputs" / "cpu"
    res = run(cfg, out, TinyFactory(tokenizer=ByteIds()))
    assert [r.status for r in res] == ["done"] * len(res) and len(res) == 2, [r.message for r in res]
    recs = StudyLayout(out).read_all()
    assert len(recs) == 2 * 3 and {r.task for r in recs} == {"heldout"}
    assert {r.prompt_id for r in recs} <= {f"mine:h{i}" for i in range(4)}
    plan = json.loads((out / "study.json").read_text())
    assert plan["tasks"]["heldout"]["category"] == "heldout" and plan["tasks"]["heldout"]["seed_reference"] == {}
    study = load_outputs(out)
    assert seed_reference("heldout", study) == "no seed row: a user category"
    table, raw = task_table(study)
    assert list(raw["task"]) == ["heldout"]
    assert list(table["Seed article (quoted, not measured)"]) == ["no seed row: a user category"]
    assert seed_reference("code", study) != "no seed row: a user category"  # a seed category keeps its row


class Recording:
    """A backend factory that records every call and builds nothing."""

    def __init__(self):
        self.calls = []

    def __call__(self, *a, **kw):
        self.calls.append((a, kw))
        raise AssertionError("an engine was asked for")


def bad_task(tmp_path: Path) -> Path:
    data, _ = jsonl(tmp_path)  # 4 prompts
    task = task_yaml(tmp_path, data, "0" * 64, colour="blue")  # an unknown key and a stale pin
    raw = yaml.safe_load(task.read_text())
    raw["sources"].append({**raw["sources"][0], "name": "gone", "path": str(tmp_path / "gone.jsonl")})
    task.write_text(yaml.safe_dump(raw))
    return task


EXPECTED_KEYS = ("colour", "sources[0].sha256", "sources[1].path")


def test_a_bad_task_file_fails_before_any_engine_loads_listing_every_problem(tmp_path):
    cfg = load_study("cpu", study_yaml(tmp_path, [str(bad_task(tmp_path))]))
    factory = Recording()
    out = tmp_path / "outputs" / "cpu"
    with pytest.raises(ParamsProblems) as e:
        run(cfg, out, factory)
    assert factory.calls == [] and not out.exists()
    assert sorted(p.key for p in e.value.problems) == sorted(EXPECTED_KEYS)
    lines = str(e.value).splitlines()
    assert lines[0].startswith("3 problems") and len(lines) == 4
    for key in EXPECTED_KEYS:
        assert any(f"{key}=" in line and "allowed" in line for line in lines[1:]), (key, lines)


def test_too_few_prompts_for_the_sweep_and_its_warmup_name_the_study_key(tmp_path):
    data, sha = jsonl(tmp_path)  # 4 prompts: 4 measured + 1 warm-up do not fit
    task_yaml(tmp_path, data, sha)
    cfg = load_study("cpu", study_yaml(tmp_path, ["heldout.yaml"], prompts=4, warmup=1))
    factory = Recording()
    with pytest.raises(ParamsError) as e:
        run(cfg, tmp_path / "out", factory)
    assert factory.calls == []
    assert e.value.key == "study.prompts_per_task" and e.value.value == 4 and e.value.file == cfg.file
    assert "at most 3 for task 'heldout'" in str(e.value) and "warmup.requests=1" in str(e.value)
    ok = load_study("cpu", study_yaml(tmp_path, ["heldout.yaml"], prompts=3, warmup=1))
    res = run(ok, tmp_path / "out2", TinyFactory(tokenizer=ByteIds()))
    assert all(r.status == "done" for r in res), [r.message for r in res]


def test_specstudy_run_checks_task_files_before_installing_or_loading_anything(tmp_path, monkeypatch, capsys):
    import specstudy.commands.run_command as run_cmd
    import specstudy.run.pool as pool

    calls = []
    monkeypatch.setattr(run_cmd, "prepare_machine", lambda *a, **k: calls.append("prepare_machine") or [])
    monkeypatch.setattr(pool, "get_backend", lambda *a, **k: calls.append("get_backend"))
    study = study_yaml(tmp_path, [str(bad_task(tmp_path))])
    rc = cli_main(["run", "--params", str(study), "--outputs", str(tmp_path / "outputs"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and calls == [] and not (tmp_path / "outputs").exists()
    assert "3 problems" in err and all(f"{key}=" in err for key in EXPECTED_KEYS), err
    # the dry run reports the same problems
    assert cli_main(["run", "--params", str(study), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "3 problems" in err and all(f"{key}=" in err for key in EXPECTED_KEYS), err


def test_study_task_entries_resolve_and_two_files_of_one_name_are_refused(tmp_path):
    data, sha = jsonl(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    task_yaml(tmp_path / "a", data, sha)
    task_yaml(tmp_path / "b", data, sha)
    cfg = load_study("cpu", study_yaml(tmp_path, ["code", "a/heldout.yaml", "params/tasks/chat.yaml"]))
    assert cfg.sweeps[0].tasks == ("code", "heldout", "chat")
    assert Path(cfg.task_files["chat"]).parent == Path(cfg.task_files["code"]).parent  # the repository's
    with pytest.raises(ParamsError) as e:
        load_study("cpu", study_yaml(tmp_path, ["a/heldout.yaml", "b/heldout.yaml"]))
    assert e.value.key == "study.tasks" and e.value.value == "b/heldout.yaml" and "rename" in str(e.value)
    with pytest.raises(ParamsError) as e:
        load_study("cpu", study_yaml(tmp_path, ["c/heldout.yaml"]))
    assert e.value.value == "c/heldout.yaml" and str(tmp_path / "c" / "heldout.yaml") in str(e.value)
    with pytest.raises(ParamsError) as e:
        load_study("cpu", study_yaml(tmp_path, ["heldout"]))  # a bare name is looked up in params/tasks/
    assert e.value.value == "heldout" and "translation" in str(e.value.allowed)
