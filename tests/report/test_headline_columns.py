"""A headline column is one line in ``tables.HEADLINE_COLUMNS`` over a field of a row's part: added there,
it reaches the table and the rendered report (docs/methodology.md, "Adding a headline column")."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from specstudy.analysis.rows import hardware_rows
from specstudy.analysis.study_records import load as load_outputs
from specstudy.report import tables, writer
from specstudy.report.format import fmt_ci

FIXTURE = Path(__file__).parents[1] / "fixtures" / "report_render" / "cpu"

TPOT_MS = tables.Column(
    "TPOT ms (planted)",
    tables.estimate(lambda p: (p.latency.tpot_s * 1e3, (p.latency.tpot_ci[0] * 1e3, p.latency.tpot_ci[1] * 1e3)), 1),
)


def _copy(tmp_path: Path) -> Path:
    out = tmp_path / "cpu"
    shutil.copytree(FIXTURE, out)
    return out


def test_the_headline_table_shows_exactly_the_declared_columns(tmp_path):
    study = load_outputs(_copy(tmp_path))
    display, raw = tables.hardware_table(study)
    assert list(display.columns) == [c.title for c in tables.HEADLINE_COLUMNS]
    assert len(display) == len(raw) > 1


def test_a_column_added_to_the_list_reaches_the_table_and_the_report(tmp_path, monkeypatch):
    out = _copy(tmp_path)
    monkeypatch.setattr(tables, "HEADLINE_COLUMNS", [*tables.HEADLINE_COLUMNS, TPOT_MS])
    study = load_outputs(out)
    display, _ = tables.hardware_table(study)
    rows = hardware_rows(study)
    want = [
        fmt_ci(
            r.pooled.latency.tpot_s * 1e3,
            (r.pooled.latency.tpot_ci[0] * 1e3, r.pooled.latency.tpot_ci[1] * 1e3),
            1,
            n=r.pooled.sample.n_prompts,
        )
        for r in rows
    ]
    assert list(display[TPOT_MS.title]) == want and any("[" in w for w in want)  # a value with its interval
    writer.write_report(out, html=False)
    report = (out / "report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| Method") and "Seed row" in line)
    assert header.rstrip(" |").endswith(TPOT_MS.title)
    assert pd.read_csv(out / "tables" / "hardware.csv")["tpot_ci"].notna().all()  # the part's field, in the CSV
