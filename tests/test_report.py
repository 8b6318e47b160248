"""The report: seed-shaped tables from records, numbers identical to specstudy.metrics, figures in
PNG and PDF, provenance, failed cells, and the cross-hardware merge."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from specstudy import metrics, report
from specstudy.runner import run_study
from specstudy.study import expand, load_study

from test_runner import TinyFactory, tiny_requests, write_study

STUDY = """
study:
  name: tiny-report
  models:
    - {name: tiny, target: smollm2-135m, dtype: float64, params: {target: 200000}}
  methods:
    - {method: ar}
    - {method: ngram, label: Prompt lookup, options: {ngram_min: 1, ngram_max: 2}}
    - {method: layer_skip, label: Early exit, options: {exit_layer: 1}, max_batch_size: 1}
  frameworks: [reference]
  tasks: [code, chat]
  gammas: [2]
  batch_sizes: [1]
  warmup: {requests: 1, max_new_tokens: 2}
  max_new_tokens: 6
  prompts_per_task: 3
  telemetry_period_s: 0.05
  sweeps:
    hardware: {}
    task_category: {gammas: [2, 3]}
    method_family: {tasks: [code], batch_sizes: [1, 2]}
    short_outputs: {tasks: [code], max_new_tokens: 3}
"""


@pytest.fixture(scope="module")
def study_out(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("report")
    cfg = load_study("cpu", write_study(tmp, STUDY))
    out = tmp / "outputs" / "cpu"
    res = run_study(cfg, expand(cfg), out, factory=TinyFactory(), request_loader=tiny_requests, progress=False,
                    log=lambda m: None)
    assert all(r.status == "done" for r in res)
    return out


def _table(md: str, heading: str) -> list[list[str]]:
    """Rows of the first markdown table after ``heading``."""
    part = md.split(heading, 1)[1]
    lines = [l for l in part.splitlines() if l.startswith("|")]
    rows, started = [], False
    for l in part.splitlines():
        if l.startswith("|"):
            started = True
            rows.append([c.strip() for c in l.strip("|").split("|")])
        elif started:
            break
    assert lines, f"no table after {heading!r}"
    return rows


def test_report_has_every_section_with_measured_numbers(study_out):
    path = report.write_report(study_out)
    md = path.read_text()
    for heading in ("## Hardware table", "## Frameworks", "## Method family — Prompt lookup",
                    "## Method family — Self-speculation", "## Task categories",
                    "## When speculation does not pay (FAQ Q4)", "## Benchmark hygiene", "## Provenance",
                    "## Failed cells"):
        assert heading in md, heading
    hw = _table(md, "## Hardware table")
    assert hw[0][:6] == ["Method", "Framework", "Target", "Draft", "γ", "α"] and "Speedup" in hw[0] and "n" in hw[0]
    body = {r[0]: dict(zip(hw[0], r)) for r in hw[2:]}
    assert {"Baseline (AR)", "Prompt lookup", "Early exit"} <= set(body)
    ci = re.compile(r"^\d+\.\d+(×)? \[\d+\.\d+, \d+\.\d+\]$")
    assert ci.match(body["Early exit"]["Speedup"]) and ci.match(body["Early exit"]["α"])
    assert ci.match(body["Baseline (AR)"]["tokens/s"])
    assert int(body["Early exit"]["n"]) == 6  # 2 tasks x 3 prompts, paired
    tasks = _table(md, "## Task categories")
    assert {r[0] for r in tasks[2:]} == {"Code generation", "Dialogue / chat"}
    assert "Optimal γ" in " ".join(tasks[0])
    assert "git:" in md and "torch" in md and "CPU:" in md
    assert "prediction" in md.split("## When speculation does not pay")[1]
    assert "### (3) Short outputs" in md and "| Early exit γ=2 | 3 |" in md
    html = path.with_suffix(".html").read_text()
    assert "data:image/png;base64" in html and "Hardware table" in html
    for m in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        png = study_out / m
        assert png.exists() and png.with_suffix(".pdf").exists(), m


def test_headline_numbers_are_the_metrics_functions(study_out):
    data = report.load_study_data(study_out)
    _, raw = report.hardware_rows(data)
    row = raw[(raw["label"] == "Early exit")].iloc[0]
    cells = data.cell_ids("hardware", method="layer_skip", batch_size=1, max_new_tokens=6)
    spec = [r for c in cells for r in data.records[c]]
    b, s = [], []
    for c in cells:
        bb, ss = metrics.paired_latencies(data.baseline(c), data.records[c])
        b.append(bb)
        s.append(ss)
    assert row["speedup"] == pytest.approx(metrics.speedup(np.concatenate(b), np.concatenate(s)))
    assert row["alpha"] == pytest.approx(metrics.acceptance_summary(spec)["alpha"])
    assert row["tokens_per_s"] == pytest.approx(metrics.per_request_throughput(spec))
    lo, hi = row["speedup_ci"]
    assert lo <= row["speedup"] <= hi


def test_step_costs_and_prediction_from_measured_timings(study_out):
    data = report.load_study_data(study_out)
    _, raw = report.method_rows(data, "layer_skip")
    r = raw.iloc[0]
    assert 0 < r["c"] < 5 and r["verify_ratio"] > 0
    from specstudy.costmodel import speedup_with_verify_cost

    assert r["predicted_speedup"] == pytest.approx(speedup_with_verify_cost(r["alpha_hat"], int(r["gamma"]), r["c"], r["verify_ratio"]))


def test_failed_cells_are_listed(study_out, tmp_path):
    out = tmp_path / "cpu"
    shutil.copytree(study_out, out)
    part = sorted((out / "records").glob("*layer_skip*.parquet"))[0]
    part.unlink()  # as if this cell had failed
    (out / "failed").mkdir(exist_ok=True)
    (out / "failed" / f"{part.stem}.json").write_text(f'{{"cell_id": "{part.stem}", "error": "RuntimeError: boom"}}')
    md = report.write_report(out, html=False).read_text()
    assert part.stem in md.split("## Failed cells")[1] and "boom" in md
    assert "1 failed" in md


def test_cross_hardware_report_merges_folders(study_out, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(study_out, other)
    path = report.write_cross_report([study_out, other], tmp_path / "cross")
    md = path.read_text()
    rows = _table(md, "# Cross-hardware comparison")
    assert rows[0][0] == "Hardware"
    assert len(rows[2:]) == 2 * len(report.hardware_rows(report.load_study_data(study_out))[0])
    assert (tmp_path / "cross" / "hardware.csv").exists() and path.with_suffix(".html").exists()


def test_break_even_and_formatting_helpers():
    assert report.break_even([1, 2, 4], [1.5, 1.2, 0.8]) == pytest.approx(2 ** (1 + 0.2 / 0.4))
    assert report.break_even([1, 2], [1.5, 1.2]) is None
    assert report.fmt_ci(2.0, (1.5, 2.5), 2, "×") == "2.00× [1.50, 2.50]"
    assert report.fmt_ci(float("nan"), (1, 2)) == "—"
    assert report.fmt_ci(1.0, (float("nan"), float("nan"))) == "1.00"


def test_notebook_matrix_and_makefile(study_out, tmp_path):
    jobs = report.plan_notebook_jobs(study_out)
    names = [j.name for j in jobs]
    assert names[0] == "hardware" and names[-1] == "report"
    assert {"method_family-ngram", "method_family-layer_skip", "task_category-code", "task_category-chat",
            "when_it_fails"} <= set(names)
    mk = report.write_notebook_makefile(jobs, tmp_path / "nb.mk", study_out / ".records-updated").read_text()
    assert mk.count("$(PAPERMILL)") == len(jobs)
    report_rule = next(l for l in mk.splitlines() if l.startswith(str(study_out / "notebooks" / "report.ipynb") + ":"))
    assert all(j.output in report_rule for j in jobs if j.notebook != "report")  # the report runs last


def test_report_cli_without_notebooks(study_out, capsys):
    import json

    from specstudy.cli import main

    assert main(["report", "--outputs", str(study_out.parent), "--hardware", "cpu", "--no-notebooks", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert Path(doc["report"]).exists() and doc["notebook_errors"] == []
    assert main(["report", "--outputs", str(study_out.parent), "--hardware", "h100"]) == 2  # nothing measured there
    assert "specstudy run --hardware h100" in capsys.readouterr().err


def test_stale_parts_of_an_older_plan_are_ignored(study_out, tmp_path):
    out = tmp_path / "cpu"
    shutil.copytree(study_out, out)
    part = next((out / "records").glob("*.parquet"))
    shutil.copy(part, out / "records" / "reference_old_cell.parquet")
    from specstudy.records import read_part, write_part

    recs = read_part(out / "records" / "reference_old_cell.parquet")
    for r in recs:
        r.cell_id = "reference_old_cell"
    write_part(recs, out / "records" / "reference_old_cell.parquet")
    data = report.load_study_data(out)
    assert data.stale_cells == ["reference_old_cell"] and "reference_old_cell" not in data.records


def test_eagle_and_medusa_cells_are_one_family_in_the_report():
    """A vLLM/SGLang or reference ``eagle`` cell belongs to the heads family (Medusa/EAGLE), with or
    without the plan's family field; the report has one section for it, not one per method name."""
    from specstudy.records import Cell

    def rec(method):
        cell = Cell(study="s", hardware="cpu", framework="reference", method=method, task="code", model="m",
                    drafter="d" if method != "ar" else None, gamma=3 if method != "ar" else None)
        return cell.new_record(Request("p0", ""), Sampling(temperature=0.0, max_new_tokens=4))

    from specstudy.records import Request, Sampling

    records = {"c_ar": [rec("ar")], "c_heads": [rec("heads")], "c_eagle": [rec("eagle")]}
    plans = {"c_eagle": {"cell": {"method": "eagle", "framework": "reference"}, "family": "heads"}}
    data = report.StudyData(out=Path("."), hardware="cpu", records=records, plans=plans, config={}, provenance={},
                            failed=[])
    assert data.meta("c_eagle")["family"] == "heads" and data.meta("c_heads")["family"] == "heads"
    del plans["c_eagle"]  # a folder without study.json: the study's aliases decide
    assert data.meta("c_eagle")["family"] == "heads" and data.meta("c_eagle")["method"] == "eagle"
    assert report.families_in(data) == ["heads"]
