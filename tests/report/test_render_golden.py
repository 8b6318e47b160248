"""The report of a fixed study renders byte for byte as it did: a refactor of analysis or report must not
change a word or a digit of ``report.md`` or of a table.

The records under ``tests/fixtures/report_render/cpu`` were measured once (``REPORT_STUDY`` of
``support.py``); the expected render beside them is the kit's output for them.  Lines that carry the
run's date, time or git commit are left out of the comparison.  Where a change to the report is
meant, write the new render with ``SPECSTUDY_UPDATE_GOLDEN=1 pytest tests/report/test_render_golden.py``
and review its diff like code.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from specstudy.report import writer

FIXTURE = Path(__file__).parents[1] / "fixtures" / "report_render"
STAMPED = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}|\b[0-9a-f]{40}\b")


def _unstamped(text: str) -> list[str]:
    """The lines that do not depend on when the records were taken or which commit rendered them."""
    return [line for line in text.splitlines() if not STAMPED.search(line)]


def _rendered(tmp_path: Path) -> dict[str, str]:
    """report.md and every tables/*.md of the fixture's records, rendered by the current code."""
    out = tmp_path / "cpu"
    shutil.copytree(FIXTURE / "cpu", out)
    writer.write_report(out, html=False)
    names = ["report.md", *sorted(f"tables/{p.name}" for p in (out / "tables").glob("*.md"))]
    return {n: (out / n).read_text() for n in names}


def test_the_fixed_study_renders_as_before(tmp_path):
    got = _rendered(tmp_path)
    expected = FIXTURE / "expected"
    if os.environ.get("SPECSTUDY_UPDATE_GOLDEN"):
        shutil.rmtree(expected, ignore_errors=True)
        for name, text in got.items():
            (expected / name).parent.mkdir(parents=True, exist_ok=True)
            (expected / name).write_text(text)
    want = sorted(str(p.relative_to(expected)) for p in expected.rglob("*.md"))
    assert sorted(got) == want
    for name in want:
        assert _unstamped(got[name]) == _unstamped((expected / name).read_text()), name


def test_the_comparison_sees_a_changed_digit(tmp_path):  # the check above can fail
    text = (FIXTURE / "expected" / "report.md").read_text()
    changed = text.replace("[0.83, 1.35]", "[0.83, 1.36]", 1)
    assert changed != text and _unstamped(changed) != _unstamped(text)
