"""The report's *Against published numbers* words the verdicts: a miss lists the cause its check found,
a rehearsal says REHEARSAL and gives no verdict."""

from __future__ import annotations

from specstudy.analysis.published import against_published
from specstudy.config.references import load_references
from specstudy.report.published_section import published_markdown
from tests.analysis.test_published import BOS, TARGET, _records


def _md(records, rehearsal=False):
    rows = against_published(load_references("h100-1"), records, {"llama3.1-8b": TARGET}, rehearsal=rehearsal)
    return published_markdown(rows, rehearsal)


def test_a_miss_names_the_doubled_bos():
    md = _md(_records((60, 38, 22), [BOS, BOS, 128006]))
    assert "OUTSIDE ±5%" in md
    assert (
        "a second BOS token at the prompt's start: published 128000, records: 80 of 80 recorded prompts start with it twice: FOUND"
        in md
    )
    assert "chat template applied: published True, records: [True]: not the cause" in md
    assert "vllm-project/vllm@029ba37503c5:tests/v1/spec_decode/test_acceptance_length.py" in md


def test_a_match_reads_within_and_lists_no_checks():
    md = _md(_records((73, 52, 35), [BOS, 128006]))
    assert "within ±5%" in md and "check:" not in md
    assert "speed: shown beside its source's hardware (1 x RTX 3090 24GB" not in md  # not measured here
    assert "not measured in this study" in md


def test_a_rehearsal_gives_no_verdict():
    md = _md(_records((73, 52, 35), [BOS, 128006]), rehearsal=True)
    assert md.startswith("**REHEARSAL**")
    assert "REHEARSAL: no verdict" in md and "within ±5%" not in md and "OUTSIDE" not in md


def test_the_report_head_names_the_sweeps_a_budget_cut(tmp_path):
    import json
    from types import SimpleNamespace

    from specstudy.layout import BUDGET_FILE
    from specstudy.report.sections import report_head

    study = SimpleNamespace(
        records={}, controls={}, stale_cells=[], out=tmp_path, config={"name": "h"}, hardware="h100-1"
    )
    study.planned_cells, study.failed = 0, []
    assert "Cut by the budget" not in report_head(study)
    (tmp_path / BUDGET_FILE).write_text(json.dumps({"budget_min": 30, "kept": ["calibration"], "cut": ["serving"]}))
    assert (
        "**Cut by the budget** (`--budget-min 30`, the profile's sweep order): serving not run; calibration run."
        in (report_head(study))
    )


def test_the_section_is_titled_once():
    """The report printed "## Against published numbers" twice (the section's text repeated its title)."""
    from pathlib import Path

    from specstudy.analysis.study_records import Study
    from specstudy.layout import StudyLayout
    from specstudy.report.published_section import TITLE, published_section

    study = Study(
        layout=StudyLayout(Path("/nonexistent")),
        hardware="h100-1",
        records={},
        cells={},
        plan={"config": {"models": [{"name": "llama3.1-8b", "target": "meta-llama/Llama-3.1-8B-Instruct"}]}},
        provenance={},
        failed=[],
    )
    sec = published_section(study)
    assert sec is not None and sec.to_markdown().count(TITLE) == 1
