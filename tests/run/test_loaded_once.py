"""Validated once, carried: a command parses each task file once and expands the study's matrix once;
every later step (backend checks, task checks, dry-run estimates, preflight, the runner, the report)
reads the loaded study."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
from support import ByteIds, TinyFactory, write_study_file, write_task

import specstudy.commands.report_command  # noqa: F401  # imported before the counters are put in
import specstudy.commands.run_command as run_cmd
import specstudy.run.dryrun  # noqa: F401
import specstudy.run.environment  # noqa: F401
import specstudy.run.slurm  # noqa: F401
import specstudy.run.study_runner
from specstudy.cli import main
from specstudy.config import task as task_mod
from specstudy.run import plan as plan_mod


def _rows(n=8):
    return [{"prompt": f"def f{i}(x):\n    return x * {i} + {i}\n"} for i in range(n)]


@pytest.fixture
def counted(monkeypatch):
    """(task file -> times its YAML was read, one entry per expansion of a matrix)."""
    reads: Counter[str] = Counter()
    expands: list[str] = []
    read, expand = task_mod.read_task_data, plan_mod.expand

    def counting_read(path):
        reads[str(Path(path).resolve())] += 1
        return read(path)

    def counting_expand(cfg):
        expands.append(cfg.file)
        return expand(cfg)

    monkeypatch.setattr(task_mod, "read_task_data", counting_read)
    for name, module in list(sys.modules.items()):
        if name.startswith("specstudy") and getattr(module, "expand", None) is expand:
            monkeypatch.setattr(module, "expand", counting_expand)
    return reads, expands


@pytest.fixture
def study(tmp_path):
    tasks = [write_task(tmp_path, _rows(), {"text": "prompt"}, name=n, category="code") for n in ("snippets", "more")]
    return write_study_file(tmp_path, tasks, prompts_per_task=2, max_new_tokens=4, batch_sizes=[1, 2]), tasks


def test_a_dry_run_parses_each_task_file_once_and_expands_once(study, counted, tmp_path, capsys):
    path, tasks = study
    reads, expands = counted
    assert main(["run", "--params", str(path), "--outputs", str(tmp_path / "out"), "--dry-run"]) == 0
    assert "valid" in capsys.readouterr().out
    assert {f: reads[str(f.resolve())] for f in tasks} == {f: 1 for f in tasks}
    assert expands == [str(path)]


def test_a_run_and_its_report_parse_each_task_file_once(study, counted, tmp_path, monkeypatch):
    path, tasks = study
    reads, expands = counted
    monkeypatch.setattr(run_cmd, "prepare_machine", lambda *a, **k: [])  # this machine's engines: not the point
    factory = TinyFactory(tokenizer=ByteIds())
    real_run = specstudy.run.study_runner.run_study
    monkeypatch.setattr(specstudy.run.study_runner, "run_study", lambda *a, **k: real_run(*a, factory=factory, **k))
    out = tmp_path / "outputs"
    assert main(["run", "--params", str(path), "--outputs", str(out), "--no-progress"]) == 0
    assert len(factory.runs) > 0  # the cells ran, on the tiny model, from the task files' prompts
    assert {f: reads[str(f.resolve())] for f in tasks} == {f: 1 for f in tasks}
    assert expands == [str(path)]
    reads.clear()
    assert main(["report", "--hardware", "cpu", "--outputs", str(out), "--no-notebooks"]) == 0
    assert all(reads[str(f.resolve())] <= 1 for f in tasks), reads  # the report reads the plan's snapshot
    assert expands == [str(path)]
