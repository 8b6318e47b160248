"""The report in two parts: a main body a reviewer reads in ten minutes, then the appendix, in one file.

Read on the fixed study of ``tests/fixtures/report_render`` (the golden render beside it is checked byte
for byte by test_render_golden): the body holds the summary, one validity line, the headline table, one
figure per question of the seed and the definitions once; no paragraph of the report is repeated.
"""

from __future__ import annotations

import re
import shutil
from collections import Counter
from pathlib import Path

from specstudy.report import writer

FIXTURE = Path(__file__).parents[1] / "fixtures" / "report_render" / "cpu"
#: the issue's bound for the default study's main body
BODY_WORDS = 1500


def words(markdown: str) -> int:
    """Words a reader reads: figure links and table rules left out, table cells counted."""
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)|\(PDF: `[^`]*`\)|\|\s*---[\s|-]*", " ", markdown)
    return len(re.findall(r"[^\s|]+", text))


def repeated_paragraphs(markdown: str, min_chars: int = 80) -> list[str]:
    """Paragraphs (not table rows or headings) that appear more than once."""
    paras = [p.strip() for p in markdown.split("\n\n")]
    prose = [p for p in paras if len(p) >= min_chars and not p.startswith(("|", "#", "!["))]
    return [p[:80] for p, n in Counter(prose).items() if n > 1]


def _report(tmp_path: Path) -> str:
    out = tmp_path / "cpu"
    shutil.copytree(FIXTURE, out)
    return writer.write_report(out, html=False).read_text()


def test_the_body_comes_first_then_one_appendix(tmp_path):
    md = _report(tmp_path)
    body, appendix = md.split("\n# Appendix\n")
    titles = re.findall(r"^## (.+)$", body, re.M)
    assert titles[:3] == ["Summary", "Measurement validity", "Headline table — cpu"]
    assert titles[3:] == [
        "Which method on this hardware?",
        "Which tasks accept?",
        "Which γ?",
        "Which batch size?",
        "Which framework?",
        "Methods",
    ]
    assert md.count("\n# Appendix\n") == 1 and "## Validity" in appendix and "## Method family" in appendix
    assert "(#validity)" in body and "(#methods)" in body  # details linked, definitions once
    assert words(body) <= BODY_WORDS, words(body)


def test_no_paragraph_is_repeated_and_the_definitions_stand_once(tmp_path):
    md = _report(tmp_path)
    assert repeated_paragraphs(md) == []
    assert md.count("expected accepted length, vLLM's mean acceptance length") == 1
    assert md.count("f the baseline's share of E2E before") == 1


def test_the_checks_see_a_repeat_and_count_words():
    para = "A definition said again before every table is what the house issue found, 729 words of it."
    assert repeated_paragraphs(f"{para}\n\n| a | b |\n\n{para}\n") == [para[:80]]
    assert words("one two\n\n| a | b |\n| --- | --- |\n![x](f.png)\n") == 4


def test_a_flagged_study_repeats_no_paragraph_either(tmp_path):
    """With cells flagged, each part read from the unflagged ones opens with its own left-out line (the
    summary, the verdicts, the decisions): three notes, no paragraph said twice."""
    from specstudy.analysis.study_records import load

    out = tmp_path / "cpu"
    shutil.copytree(FIXTURE, out)
    study = load(out)
    study.flags = {c: (("planted", False),) for c in list(study.records)[:3]}
    md = writer.write_report(out, html=False, study=study).read_text()
    assert md.count("flagged cells left out of") >= 2
    assert repeated_paragraphs(md) == []
