"""Compare two rendered outputs folders: every table cell, the figure names, report.md line by line.

Used to prove that a refactor renders the same records into the same tables:

    python scripts/compare_renders.py outputs-before/cpu outputs-after/cpu

Exit status 0 when every table (markdown and CSV) is identical and the same figures exist; the
report.md differences, if any, are printed for a reader to judge.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path


def _files(folder: Path, pattern: str) -> dict[str, Path]:
    return {p.name: p for p in sorted(folder.glob(pattern))}


def compare(a: Path, b: Path) -> tuple[list[str], list[str]]:
    """(table and figure problems, report.md diff lines)."""
    problems: list[str] = []
    ta, tb = _files(a / "tables", "*"), _files(b / "tables", "*")
    for name in sorted(set(ta) | set(tb)):
        if name not in ta or name not in tb:
            problems.append(f"table {name}: only in {'the first' if name in ta else 'the second'} folder")
        elif ta[name].read_bytes() != tb[name].read_bytes():
            diff = difflib.unified_diff(
                ta[name].read_text().splitlines(),
                tb[name].read_text().splitlines(),
                f"{a.name}/{name}",
                f"{b.name}/{name}",
                lineterm="",
                n=0,
            )
            problems.append(f"table {name} differs:\n" + "\n".join(list(diff)[:20]))
    fa, fb = set(_files(a / "figures", "*")), set(_files(b / "figures", "*"))
    if fa != fb:
        problems.append(f"figures only in the first: {sorted(fa - fb)}; only in the second: {sorted(fb - fa)}")
    ra, rb = (a / "report.md").read_text().splitlines(), (b / "report.md").read_text().splitlines()
    report = list(difflib.unified_diff(ra, rb, "first/report.md", "second/report.md", lineterm="", n=0))
    return problems, report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("first", type=Path)
    p.add_argument("second", type=Path)
    args = p.parse_args(argv)
    problems, report = compare(args.first, args.second)
    n_tables = len(list((args.first / "tables").glob("*")))
    n_figs = len(list((args.first / "figures").glob("*")))
    for line in problems:
        print(line)
    print(
        f"tables: {n_tables} files compared, {sum(1 for x in problems if x.startswith('table'))} differ; "
        f"figures: {n_figs} files, names {'identical' if not any(x.startswith('figures') for x in problems) else 'DIFFER'}"
    )
    print(f"report.md: {'identical' if not report else f'{len(report)} diff lines:'}")
    for line in report[:60]:
        print("  " + line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
