"""The report: seed-shaped tables from records, numbers identical to specstudy.metrics, figures in
PNG and PDF, provenance, failed cells, and the cross-hardware merge."""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from specstudy import metrics
from specstudy.analysis import stats
from specstudy.analysis.study_records import load
from specstudy.report import tables, writer
from specstudy.report.format import fmt_ci
from specstudy.report.notebooks import execute_notebooks, plan_notebook_jobs, stale_jobs


@pytest.fixture
def study_out(report_study):
    return report_study


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
    path = writer.write_report(study_out)
    md = path.read_text()
    for heading in (
        "## Headline table",
        "## Frameworks",
        "## Method family — Prompt lookup",
        "## Method family — Self-speculation",
        "## Task categories",
        "## When speculation does not pay (FAQ Q4)",
        "## Benchmark hygiene",
        "## Provenance",
        "## Failed cells",
    ):
        assert heading in md, heading
    hw = _table(md, "## Headline table")
    assert hw[0][:9] == ["Method", "Seed row", "Framework", "Precision", "Target", "Draft", "γ", "Sampling", "α"]
    assert {"AL", "tokens/s", "Speedup", "n (prompts)", "repeats", "Precision reached"} <= set(hw[0])
    seed_metrics = _table(md, "The rest of the seed's metric table for the headline rows")
    assert {
        "TTFT ms (mean / p50 / p99)",
        "TPOT ms (mean / p50 / p99)",
        "E2E ms (mean / p50 / p99)",
        "Memory overhead",
        "PPL Δ (spec − AR)",
        "Exact match (greedy)",
        "tokens / target forward",
    } <= set(seed_metrics[0])
    assert (
        "## Summary" in md.split("## Headline table")[0] and "(tables/hardware.md)" in md.split("## Headline table")[0]
    )
    tex = (study_out / "tables" / "hardware.tex").read_text()
    assert "\\toprule" in tex and "$\\alpha$" in tex and "\\bottomrule" in tex
    body = {r[0]: dict(zip(hw[0], r)) for r in hw[2:]}
    assert {"Baseline (AR)", "Prompt lookup", "Early exit"} <= set(body)
    ci = re.compile(r"^\d+\.\d+(×)? \[\d+\.\d+, \d+\.\d+\]$")
    assert (
        ci.match(body["Early exit"]["Speedup"])
        and ci.match(body["Early exit"]["α"])
        and ci.match(body["Early exit"]["AL"])
    )
    assert ci.match(body["Baseline (AR)"]["tokens/s"])
    assert int(body["Early exit"]["n (prompts)"]) == 6  # 2 tasks x 3 distinct prompts, paired
    tasks = _table(md, "## Task categories")
    assert {r[0] for r in tasks[2:]} == {"Code generation", "Dialogue / chat"}
    assert "Optimal γ" in " ".join(tasks[0])
    assert "git:" in md and "torch" in md and "CPU:" in md
    assert "prediction" in md.split("## When speculation does not pay")[1]
    assert "### (3) Short outputs" in md and "| Early exit γ=2 | 3 |" in md
    html = path.with_suffix(".html").read_text()
    assert "data:image/png;base64" in html and "Headline table" in html
    for m in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        png = study_out / m
        assert png.exists() and png.with_suffix(".pdf").exists(), m


def test_report_pdf_has_the_text_tables_and_figures(study_out):
    """report.pdf beside report.html, read back as a reader would: its pages' text and embedded images."""
    from PIL import Image
    from pypdf import PdfReader

    md = writer.write_report(study_out, html=False, pdf=True).read_text()
    pages = PdfReader(study_out / "report.pdf").pages
    text = "\n".join(p.extract_text() for p in pages)
    words = set(text.split())
    for heading in ("Headline table", "Method family — Prompt lookup", "Task categories", "Benchmark hygiene"):
        assert heading in text, heading
    hw = _table(md, "## Headline table")
    for row in hw[:1] + hw[2:]:  # every word of the hardware table (header and rows), however its cells wrap
        missing = {w for cell in row for w in cell.split()} - words
        assert not missing, (row, missing)
    assert "α" in words and "γ" in words  # the font has the Greek letters (the standard PDF fonts have none)
    figs = re.findall(r"!\[[^\]]*\]\((figures/[^)]+\.png)\)", md)
    assert "figures/hardware_methods.png" in figs and "figures/method_ngram_pareto.png" in figs
    per_page = [len(p.images) for p in pages]
    assert sum(per_page) == len(figs) and max(per_page) > 0
    # each figure embedded at its own resolution, not redrawn or resampled
    sizes = sorted(img.image.size for p in pages for img in p.images)
    pngs = []
    for f in figs:
        with Image.open(study_out / f) as im:
            pngs.append(im.size)
    assert sizes == sorted(pngs)
    # the hardware figure sits just above its "(PDF: ...)" line: on that page, or at the foot of the one before
    at = next(i for i, p in enumerate(pages) if "figures/hardware_methods.pdf" in p.extract_text())
    assert per_page[at] > 0 or (at > 0 and per_page[at - 1] > 0)


def test_headline_numbers_are_the_metrics_functions(study_out):
    data = load(study_out)
    _, raw = tables.hardware_table(data)
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
    data = load(study_out)
    _, raw = tables.method_table(data, "layer_skip")
    r = raw.iloc[0]
    assert 0 < r["c"] < 5 and r["verify_ratio"] > 0
    # the measured draft mix: tokens per decode step / cost per decode step (× the AR step T1), a step
    # drafting k costing c·k + its measured verification, one drafting nothing its measured cost
    mix = r["draft_mix"]
    n, d, a = mix["decode_steps"], mix["drafted_ge"], mix["accepted_ge"]
    assert len(d) == int(r["gamma"]) and set(mix["verify_by_k"]) <= set(range(1, len(d) + 1))
    per_k = {k: d[k - 1] - (d[k] if k < len(d) else 0) for k in range(1, len(d) + 1)}
    cost = ((n - d[0]) * mix["no_draft"] if n > d[0] else 0.0) + sum(
        m * (mix["c"] * k + mix["verify_by_k"][k]) for k, m in per_k.items() if m
    )
    decode = (n + sum(a)) / cost
    f = r["prefill_share"]  # the AR baseline's share of E2E before its first token: speculation leaves it alone
    assert 0.0 < f < 1.0
    assert r["predicted_speedup"] == pytest.approx(1.0 / (f + (1.0 - f) / decode))


def test_failed_cells_are_listed(study_out, tmp_path):
    out = tmp_path / "cpu"
    shutil.copytree(study_out, out)
    part = sorted((out / "records").glob("*layer_skip*.parquet"))[0]
    part.unlink()  # as if this cell had failed
    (out / "failed").mkdir(exist_ok=True)
    (out / "failed" / f"{part.stem}.json").write_text(f'{{"cell_id": "{part.stem}", "error": "RuntimeError: boom"}}')
    md = writer.write_report(out, html=False).read_text()
    assert part.stem in md.split("## Failed cells")[1] and "boom" in md
    assert "1 failed" in md


def test_cross_hardware_report_merges_folders(study_out, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(study_out, other)
    path = writer.write_cross_report([study_out, other], tmp_path / "cross")
    md = path.read_text()
    rows = _table(md, "# Cross-hardware comparison")
    assert rows[0][0] == "Hardware"
    assert len(rows[2:]) == 2 * len(tables.hardware_table(load(study_out))[0])
    assert (tmp_path / "cross" / "hardware.csv").exists() and path.with_suffix(".html").exists()
    assert path.with_suffix(".pdf").exists()


def test_break_even_and_formatting_helpers():
    assert stats.break_even([1, 2, 4], [1.5, 1.2, 0.8]) == pytest.approx(2 ** (1 + 0.2 / 0.4))
    assert stats.break_even([1, 2], [1.5, 1.2]) is None
    assert fmt_ci(2.0, (1.5, 2.5), 2, "×") == "2.00× [1.50, 2.50]"
    assert fmt_ci(float("nan"), (1, 2)) == "—"
    assert fmt_ci(1.0, (float("nan"), float("nan"))) == "1.00"


def test_notebook_matrix_report_first_and_only_stale_ones(study_out, tmp_path, monkeypatch):
    jobs = plan_notebook_jobs(study_out, load(study_out).plan["cells"])
    names = [j.name for j in jobs]
    assert names[0] == "hardware" and names[-1] == "report"
    assert {
        "method_family-ngram",
        "method_family-layer_skip",
        "task_category-code",
        "task_category-chat",
        "when_it_fails",
    } <= set(names)
    started: list[str] = []

    def fake_run(argv, **kw):  # papermill's CLI: writes the output it is given
        out = next(a for a in argv if a.endswith(".tmp.ipynb"))
        started.append(Path(out).name)
        Path(out).write_text("{}")
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(subprocess, "run", fake_run)
    jobs = [dataclasses.replace(j, output=str(tmp_path / Path(j.output).name)) for j in jobs]
    stamp = tmp_path / ".records-updated"
    stamp.touch()
    assert stale_jobs(jobs, stamp) == jobs  # nothing executed yet
    results = execute_notebooks(jobs, log=lambda m: None, workers=1)
    # the exploring notebooks write nothing: the report is started first, and results keep the jobs' order
    assert started[0] == "report.tmp.ipynb" and [j for j, _ in results] == jobs
    assert all(err is None for _, err in results) and all(Path(j.output).exists() for j in jobs)
    assert stale_jobs(jobs, stamp) == []  # a rerun executes nothing again
    os.utime(stamp, (time.time() + 5, time.time() + 5))  # records written after the notebooks
    assert stale_jobs(jobs, stamp) == jobs


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
    data = load(out)
    assert data.stale_cells == ["reference_old_cell"] and "reference_old_cell" not in data.records


def test_eagle_and_medusa_cells_are_one_family_in_the_report(tmp_path):
    """A vLLM/SGLang or reference ``eagle`` cell belongs to the heads family (Medusa/EAGLE), with or
    without the plan's family field; the report has one section for it, not one per method name."""
    from specstudy.layout import StudyLayout
    from specstudy.records import Cell, Request, Sampling

    def rec(method):
        cell = Cell(
            study="s",
            hardware="cpu",
            framework="reference",
            method=method,
            task="code",
            model="m",
            drafter="d" if method != "ar" else None,
            gamma=3 if method != "ar" else None,
            id=f"c_{method}",
        )
        return cell.new_record(Request("p0", ""), Sampling(temperature=0.0, max_new_tokens=4))

    lay = StudyLayout(tmp_path / "cpu")
    for m in ("ar", "heads", "eagle"):
        lay.write_part(f"c_{m}", [rec(m)])
    data = load(lay.root)  # no plan and no stamped columns: the study's aliases decide
    assert data.meta("c_eagle")["family"] == "heads" and data.meta("c_heads")["family"] == "heads"
    assert data.meta("c_eagle")["method"] == "eagle" and tables.families_in(data) == ["heads"]
    lay.write_plan(
        {
            "cells": [
                {
                    "cell_id": "c_eagle",
                    "cell": {"method": "eagle", "framework": "reference"},
                    "family": "heads",
                    "label": "EAGLE",
                }
            ]
        }
    )
    data = load(lay.root)  # an older folder: the plan's own family and label fill the missing columns
    assert data.meta("c_eagle")["family"] == "heads" and data.meta("c_eagle")["label"] == "EAGLE"
