"""The notebooks are thin (a papermill parameters cell, then calls into specstudy.report) and
execute through papermill on a tiny records folder."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
EXPECTED = ["hardware", "method_family", "report", "task_category", "when_it_fails"]


def test_the_five_notebooks_exist():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_is_thin_with_a_parameters_cell(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", []), "first code cell must be papermill's parameters cell"
    params = ast.parse(code[0].source)
    assert all(isinstance(n, ast.Assign) for n in params.body), "the parameters cell only assigns values"
    assert any(t.id == "out_dir" for n in params.body for t in n.targets)
    for c in code[1:]:
        tree = ast.parse(c.source)
        # no logic in notebooks: no loops, no function or class definitions, no arithmetic on data
        banned = (ast.For, ast.While, ast.FunctionDef, ast.ClassDef, ast.Lambda, ast.ListComp, ast.BinOp, ast.If)
        bad = [type(n).__name__ for n in ast.walk(tree) if isinstance(n, banned)]
        assert not bad, f"{name}: logic belongs in specstudy.report, found {bad}"
        imported = {a.name for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in n.names}
        assert imported <= {"report", "Markdown", "display"}, imported
        assert not any(o.get("output_type") for o in c.get("outputs", [])), "commit notebooks without outputs"


@pytest.mark.slow
def test_notebooks_execute_with_papermill_on_tiny_records(tmp_path):
    """Every notebook of the matrix runs through papermill and the report it writes has the tables."""
    from specstudy.report import execute_notebooks, plan_notebook_jobs
    from specstudy.runner import run_study
    from specstudy.study import expand, load_study

    from test_report import STUDY
    from test_runner import TinyFactory, tiny_requests, write_study

    cfg = load_study("cpu", write_study(tmp_path, STUDY))
    out = tmp_path / "outputs" / "cpu"
    run_study(cfg, expand(cfg), out, factory=TinyFactory(), request_loader=tiny_requests, progress=False,
              log=lambda m: None)
    jobs = plan_notebook_jobs(out)
    results = execute_notebooks(jobs, log=lambda m: None)
    assert [e for _, e in results if e] == []
    for j in jobs:
        nb = json.loads(Path(j.output).read_text())
        outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
        assert not [o for o in outputs if o.get("output_type") == "error"], j.name
        assert any("data" in o for o in outputs), f"{j.name} displayed nothing"
    md = (out / "report.md").read_text()
    assert "## Hardware table" in md and "## Task categories" in md and (out / "report.html").exists()
    assert (out / "figures" / "hardware_methods.png").exists() and (out / "figures" / "hardware_methods.pdf").exists()
