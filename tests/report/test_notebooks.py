"""The notebooks are for exploring: a papermill parameters cell, frames, a visible groupby, table and figure
calls.  What belongs in the package (file writes, metric definitions) is not in them; they execute
through papermill on a tiny study and display what they compute."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import nbformat
import pytest

from specstudy.analysis.study_records import load
from specstudy.report.notebooks import execute_notebooks, plan_notebook_jobs

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
EXPECTED = ["hardware", "method_family", "report", "task_category", "when_it_fails"]
#: calls that write files: only specstudy.report.writer does that
WRITERS = {
    "open",
    "write_text",
    "write_bytes",
    "to_csv",
    "to_parquet",
    "to_json",
    "savefig",
    "write_report",
    "save_table",
    "save_figure",
    "write_part",
}


def test_the_five_notebooks_exist():
    assert sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb")) == EXPECTED


def _calls(tree: ast.AST) -> set[str]:
    names = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            f = n.func
            names.add(f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", ""))
    return names


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_explores_and_leaves_logic_to_the_package(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert "parameters" in code[0].metadata.get("tags", []), "first code cell must be papermill's parameters cell"
    params = ast.parse(code[0].source)
    assert all(isinstance(n, ast.Assign) for n in params.body), "the parameters cell only assigns values"
    assert any(t.id == "out_dir" for n in params.body for t in n.targets)
    trees = [ast.parse(c.source) for c in code[1:]]
    for c, tree in zip(code[1:], trees):
        # no metric definitions (functions, classes, lambdas, arithmetic on data) and no file writes;
        # filters (a & b, a | b) and comparisons are what exploring is made of
        banned = (ast.FunctionDef, ast.ClassDef, ast.Lambda, ast.For, ast.While)
        arithmetic = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.MatMult)
        bad = [
            type(n).__name__
            for n in ast.walk(tree)
            if isinstance(n, banned) or (isinstance(n, ast.BinOp) and isinstance(n.op, arithmetic))
        ]
        assert not bad, f"{name}: logic belongs in specstudy, found {bad}"
        writes = _calls(tree) & WRITERS
        assert not writes or (name == "report" and writes <= {"write_report"}), f"{name}: writes files: {writes}"
        assert not any(o.get("output_type") for o in c.get("outputs", [])), "commit notebooks without outputs"
    if name != "report":  # an explorer: tidy frames and a grouping a reader can edit
        calls = set().union(*(_calls(t) for t in trees))
        assert calls & {"groupby", "pivot_table"}, f"{name} has no visible groupby or pivot"
        assert "load" in calls and calls & {"requests_frame", "entropy_points", "per_cell_acceptance"}


@pytest.mark.slow
def test_notebooks_execute_with_papermill_on_tiny_records(report_study):
    """Every notebook of the matrix runs through papermill, shows frames and figures, and the report has its tables."""
    out = report_study
    jobs = plan_notebook_jobs(out, load(out).plan["cells"])
    results = execute_notebooks(jobs, log=lambda m: None)
    assert [e for _, e in results if e] == []
    for j in jobs:
        nb = json.loads(Path(j.output).read_text())
        outputs = [o for c in nb["cells"] if c["cell_type"] == "code" for o in c.get("outputs", [])]
        assert not [o for o in outputs if o.get("output_type") == "error"], j.name
        assert any("text/html" in o.get("data", {}) or "text/markdown" in o.get("data", {}) for o in outputs), (
            f"{j.name} displayed no table"
        )
        if j.notebook in ("hardware", "method_family"):
            assert any("image/png" in o.get("data", {}) for o in outputs), f"{j.name} displayed no figure"
    md = (out / "report.md").read_text()
    assert "## Headline table" in md and "## Task categories" in md and (out / "report.html").exists()
    assert (out / "figures" / "hardware_methods.png").exists() and (out / "figures" / "hardware_methods.pdf").exists()


def test_a_broken_notebook_names_the_underlying_exception(tmp_path):
    """A notebook over a folder it cannot read fails with the exception's own type and message."""
    (tmp_path / "cpu" / "records").mkdir(parents=True)
    (tmp_path / "cpu" / "records" / "x.parquet").write_bytes(b"not parquet")
    jobs = [
        j
        for j in plan_notebook_jobs(tmp_path / "cpu", [{"cell": {"task": "code", "method": "ar"}, "family": "ar"}])
        if j.notebook == "hardware"
    ]
    ((_, err),) = execute_notebooks(jobs, log=lambda m: None)
    assert err and "BadPartError" in err and "x.parquet" in err


def test_a_study_that_lists_some_notebooks_still_renders_its_report(tmp_path):
    """``notebooks: [hardware, task_category]`` (cpu-pair) chooses the exploring notebooks; report.ipynb always runs."""
    cells = [{"cell": {"task": "code", "method": "ngram"}, "family": "ngram"}]
    jobs = plan_notebook_jobs(tmp_path / "cpu-pair", cells, notebooks=["hardware", "task_category"])
    assert [j.notebook for j in jobs] == ["hardware", "task_category", "report"]


def test_the_study_papermill_entry_point_runs_a_notebook_without_the_iri_parser(tmp_path):
    """``python -m specstudy.report.papermill_cli`` (what ``specstudy study`` runs per notebook) is papermill's CLI:
    parameters injected, outputs written, the notebook valid, and jsonschema's IRI checker unloaded."""
    import subprocess
    import sys

    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}}
    nb.cells = [nbformat.v4.new_code_cell("x = 1", metadata={"tags": ["parameters"]})]
    nb.cells.append(nbformat.v4.new_code_cell("print(x * 2)"))
    src, out = tmp_path / "n.ipynb", tmp_path / "out.ipynb"
    nbformat.write(nb, src)
    args = [str(src), str(out), "-p", "x", "21", "--kernel", "python3", "--no-progress-bar"]
    cmd = [sys.executable, "-m", "specstudy.report.papermill_cli", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    ran = nbformat.read(out, 4)
    nbformat.validate(ran)
    assert ran.cells[-1].outputs[0]["text"].strip() == "42"
    loaded = "print(sys.modules.get('rfc3987_syntax') is not None)"
    cli = f"import sys; sys.argv = ['papermill', '--help']\ntry:\n    main()\nexcept SystemExit:\n    pass\n{loaded}"
    ours = subprocess.run(
        [sys.executable, "-c", f"from specstudy.report.papermill_cli import main\n{cli}"],
        capture_output=True,
        text=True,
    )
    assert ours.stdout.strip().splitlines()[-1] == "False"  # blocked in the entry point


def _banner_cell(name: str):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    return [c for c in nb.cells if c.cell_type == "code"][1]


@pytest.mark.parametrize("name", EXPECTED)
def test_each_notebook_opens_with_the_rehearsal_banner(name):
    """The cell after the parameters displays the outputs folder's REHEARSAL banner (empty for a study)."""
    tree = ast.parse(_banner_cell(name).source)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "rehearsal_banner"]
    assert [ast.unparse(c) for c in calls] == ["rehearsal_banner(out_dir)"]
    assert "display(Markdown(rehearsal_banner(out_dir)))" in _banner_cell(name).source


def test_the_banner_is_the_rehearsal_markers(tmp_path):
    from specstudy.layout import REHEARSAL_BANNER, REHEARSAL_MARKER
    from specstudy.report.banner import rehearsal_banner

    assert rehearsal_banner(tmp_path) == ""
    (tmp_path / REHEARSAL_MARKER).write_text("{}")
    assert REHEARSAL_BANNER in rehearsal_banner(tmp_path)


@pytest.mark.slow
def test_a_notebook_run_on_rehearsal_outputs_shows_the_banner(report_study, tmp_path):
    """Executed by papermill over a rehearsal's folder, a notebook's first display is the REHEARSAL
    banner; over a study's own folder, no REHEARSAL text anywhere."""
    import shutil

    from specstudy.layout import REHEARSAL_BANNER, REHEARSAL_MARKER

    def shown(out):
        jobs = [j for j in plan_notebook_jobs(out, load(out).plan["cells"]) if j.notebook == "hardware"]
        assert [e for _, e in execute_notebooks(jobs, log=lambda m: None) if e] == []
        nb = json.loads(Path(jobs[0].output).read_text())
        code = [c for c in nb["cells"] if c["cell_type"] == "code"]
        return ["".join(o.get("data", {}).get("text/markdown", "")) for c in code for o in c.get("outputs", [])]

    rehearsal = tmp_path / "a100-rehearsal"
    shutil.copytree(report_study, rehearsal)
    (rehearsal / REHEARSAL_MARKER).write_text("{}")
    assert REHEARSAL_BANNER in shown(rehearsal)[0]
    plain = tmp_path / "cpu"
    shutil.copytree(report_study, plain)
    assert not any(REHEARSAL_BANNER in m for m in shown(plain))
