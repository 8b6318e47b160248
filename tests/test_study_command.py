"""``specstudy study``: one command for the cells, the notebooks and report, and the gate; one exit code.

The stages are replaced by recorders here (the real cells and notebooks run in tests/report and
tests/run); what is tested is the order, the exit code that names the first failed stage, that a
dry run or refused input stops before anything else, and that each make target is one line over it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from specstudy.cli import main
from specstudy.commands import run_command, study_command

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def stages(monkeypatch, tmp_path):
    """Each stage recorded, its outcome set by the test."""
    said: list[str] = []
    outcome = {"cells": 0, "notebooks": [], "gate": 0}

    def cells(args):
        said.append("cells")
        return outcome["cells"]

    def render(layout, workers, say=print):
        said.append(f"notebooks x{workers}")
        return outcome["notebooks"]

    def gate(layout, golden, as_json=False):
        said.append(f"gate {golden.name}")
        return outcome["gate"]

    monkeypatch.setattr(run_command, "run", cells)
    monkeypatch.setattr(study_command, "render", render)
    monkeypatch.setattr(study_command, "gate", gate)
    golden = tmp_path / "g.json"
    golden.write_text("{}")
    return said, outcome, ["study", "--outputs", str(tmp_path / "out"), "--golden", str(golden)]


def test_the_stages_run_in_order_and_all_ok_is_0(stages, capsys):
    said, _, argv = stages
    assert main(argv) == 0
    assert said == ["cells", "notebooks x2", "gate g.json"]
    assert "specstudy study: cells ok; notebooks ok; golden ok" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("cells", "notebooks", "gate", "code", "words"),
    [
        (3, [], 0, 3, "cells some failed"),
        (0, [("report", "KeyError: 'x'")], 0, 4, "notebooks failed: report"),
        (0, [], 1, 5, "golden rows moved"),
        (3, [("hardware", "boom")], 1, 3, "cells some failed"),  # the first failed stage names the code
    ],
)
def test_the_exit_code_names_the_first_failed_stage(stages, capsys, cells, notebooks, gate, code, words):
    said, outcome, argv = stages
    outcome.update(cells=cells, notebooks=notebooks, gate=gate)
    assert main(argv) == code
    assert said == ["cells", "notebooks x2", "gate g.json"]  # failed cells still get their report rendered
    assert words in capsys.readouterr().out


@pytest.mark.parametrize("cells", [2, 130])
def test_refused_input_or_an_interrupt_stops_before_the_notebooks(stages, cells):
    said, outcome, argv = stages
    outcome["cells"] = cells
    assert main(argv) == cells and said == ["cells"]


def test_a_dry_run_renders_nothing(stages):
    said, _, argv = stages
    assert main([*argv, "--dry-run"]) == 0 and said == ["cells"]


def test_without_a_golden_the_gate_is_not_checked_and_says_so(stages, capsys):
    said, _, argv = stages
    argv = [*argv[:-1], "none"]
    assert main(argv) == 0 and said == ["cells", "notebooks x2"]
    assert "golden not checked" in capsys.readouterr().out


def test_bad_options_are_refused_all_at_once_before_any_cell(stages, capsys):
    said, _, argv = stages
    bad = [*argv[:-2], "--golden", "nowhere.json", "--notebook-jobs", "0", "--price-per-hour", "-1"]
    assert main(bad) == 2 and said == []
    err = capsys.readouterr().err
    assert "--notebook-jobs=0" in err and "--price-per-hour=-1.0" in err and "--golden=nowhere.json" in err


def test_submitted_and_left_shards_print_the_follow_up_command(stages, capsys):
    said, _, argv = stages
    assert main([*argv, "--executor", "slurm", "--no-wait"]) == 0 and said == ["cells"]
    assert "Run this same command again" in capsys.readouterr().out


def test_every_study_target_of_the_makefile_is_one_line_over_specstudy_study():
    text = (ROOT / "Makefile").read_text()
    for target in ("study", "study-pair", "study-engines", "study-deploy", "rehearse"):
        recipe = re.search(rf"^{re.escape(target)}:[^\n]*\n((?:\t[^\n]*\n)+)", text, re.M)
        assert recipe, target
        lines = [ln for ln in recipe.group(1).splitlines() if "sglang-parser" not in ln]
        assert len(lines) == 1 and "$(STUDY)" in lines[0], (target, lines)
    assert re.search(r"^STUDY = \$\(BIN\)/specstudy study ", text, re.M)
