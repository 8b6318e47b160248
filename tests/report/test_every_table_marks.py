"""Issue 36 §5: "flagged rows carry a mark in every table".  The fixed study of
``tests/fixtures/report_render`` is loaded with every cell flagged; then every table of every report
section either marks each of its rows ⚑, or leaves flagged cells out (it is built from the unflagged
cells and is empty here), or is one of the tables below that hold no measured row of a cell.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd

from specstudy.analysis.study_records import load
from specstudy.report import sections
from specstudy.report.tables import FLAG_MARK

FIXTURE = Path(__file__).parents[1] / "fixtures" / "report_render" / "cpu"

#: tables whose rows are not a cell's measurement (and why)
NOT_ROWS_OF_CELLS = {
    "validity": "the findings themselves",
    "validity_reruns": "the reruns the stall rule caused",
    "validity_copying": "the copy share per task (a property of the outputs, noted, never a flag)",
    "deploy_structured_engines": "which engines combine the two (a declaration fact)",
}


def _every_cell_flagged(tmp_path: Path):
    out = tmp_path / "cpu"
    shutil.copytree(FIXTURE, out)
    study = load(out)
    study.flags = {c: (("planted", False),) for c in study.records}
    return study


def _rows_unmarked(shown: pd.DataFrame) -> list[str]:
    rows = [" | ".join(map(str, r)) for r in shown.itertuples(index=False)]
    return [r for r in rows if FLAG_MARK.strip() not in r]


def test_every_table_marks_or_leaves_out_its_flagged_rows(tmp_path):
    study = _every_cell_flagged(tmp_path)
    assert len(study.flags) >= 4
    seen, bad = [], {}
    for sec in sections.report_sections(study):
        for name, (shown, _raw) in sec.tables.items():
            seen.append(name)
            if name in NOT_ROWS_OF_CELLS or shown is None or shown.empty:
                continue
            if unmarked := _rows_unmarked(shown):
                bad[f"{sec.title}: {name}"] = unmarked[:2]
    assert not bad, bad
    assert {"hardware", "hardware_metrics", "method_ngram", "tasks"} <= set(seen)


def test_the_check_sees_an_unmarked_row():  # the test above can fail
    marked = pd.DataFrame({"Method": [f"Prompt lookup{FLAG_MARK}", "Baseline (AR)"], "Speedup": ["1.2×", "1.0×"]})
    assert _rows_unmarked(marked) == ["Baseline (AR) | 1.0×"]


def test_a_row_that_pooled_a_flagged_cell_shows_the_numbers_the_summary_reads(tmp_path):
    """The issue's ⚑ row read 1.23x in the table and 2.23x in the summary: now the table's row shows its
    unflagged cells' numbers (the summary's), still marked, and says so."""
    from specstudy.analysis.rows import hardware_rows
    from specstudy.analysis.study_records import vouched

    out = tmp_path / "cpu"
    shutil.copytree(FIXTURE, out)
    study = load(out)
    whole = next(r for r in hardware_rows(study) if r.method == "ngram" and len(r.cells) > 1)
    study.flags = {whole.cells[0]: (("planted", False),)}
    clean = next(r for r in hardware_rows(vouched(study)) if r.method == "ngram" and r.label == whole.label)
    assert clean.pooled.paired.speedup != whole.pooled.paired.speedup  # the two readings the issue saw
    hardware = next(s for s in sections.report_sections(study) if s.title.startswith("Headline table"))
    shown, raw = hardware.tables["hardware"]
    i = next(k for k, r in raw.iterrows() if r["method"] == "ngram" and r["label"] == whole.label)
    assert raw.loc[i, "speedup"] == clean.pooled.paired.speedup and FLAG_MARK in shown.loc[i, "Method"]
    assert "its numbers are those of its unflagged cells" in hardware.markdown
