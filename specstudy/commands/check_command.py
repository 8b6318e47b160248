"""specstudy check: the acceptance regression gate against a golden file.

``specstudy check --golden FILE OUTPUTS`` exits 1 naming every row whose AL, α or per-position
acceptance moved beyond the tolerance (or vanished); ``--write-golden FILE OUTPUTS`` writes one.
An engine upgrade or a drafter retrain is then a one-command question.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..analysis.golden import DEFAULT_REL_TOL, acceptance_rows, compare, golden_doc, machine_of, new_rows, tolerance_for
from ..analysis.study_records import load
from ..layout import StudyLayout, atomic_write_text
from ..report.gate import moved_text, row_name


def add_arguments(p: argparse.ArgumentParser) -> None:
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--golden", metavar="FILE", help="compare OUTPUTS with this golden file")
    what.add_argument("--write-golden", metavar="FILE", help="write OUTPUTS' acceptance rows as a golden file")
    p.add_argument("outputs", metavar="OUTPUTS", help="a study's outputs/<hardware>/ folder")
    p.add_argument(
        "--rel-tol",
        type=float,
        default=None,
        help=f"relative tolerance per position and for AL and alpha (default: the golden's own; "
        f"written goldens default to {DEFAULT_REL_TOL}; 0 = exact, for greedy rows of a deterministic engine)",
    )
    p.add_argument("--framework", action="append", default=None, help="only rows of this framework (repeatable)")
    p.add_argument("--greedy-only", action="store_true", help="only greedy rows")


def _rows(args: argparse.Namespace) -> tuple[object, dict[str, dict[str, object]]]:
    layout = StudyLayout(Path(args.outputs))
    if not layout.records_dir.is_dir():
        raise FileNotFoundError(
            f"OUTPUTS={args.outputs}: no records/ folder there; allowed: a folder `specstudy run` wrote"
        )
    study = load(layout.root)
    return study, acceptance_rows(study, args.framework, args.greedy_only)


def run(args: argparse.Namespace) -> int:
    if args.rel_tol is not None and not 0.0 <= args.rel_tol < 1.0:
        raise ValueError(f"--rel-tol={args.rel_tol}: allowed a number in [0, 1)")
    study, rows = _rows(args)
    if args.write_golden:
        if not rows:
            raise ValueError(f"OUTPUTS={args.outputs}: no speculative row with measured acceptance to write")
        tol = DEFAULT_REL_TOL if args.rel_tol is None else args.rel_tol
        doc = golden_doc(study, rows, tol)  # type: ignore[arg-type]
        atomic_write_text(Path(args.write_golden), json.dumps(doc, indent=1, sort_keys=True) + "\n")
        print(
            json.dumps({"golden": args.write_golden, "rows": len(rows)})
            if args.json
            else f"golden: {args.write_golden} ({len(rows)} rows, rel_tol {tol})"
        )
        return 0
    return check_golden(study, rows, Path(args.golden), args.rel_tol, args.json)


def check_golden(
    study: object, rows: dict[str, dict[str, object]], golden_path: Path, rel_tol: float | None, as_json: bool
) -> int:
    """The gate: 1 naming every golden row of ``rows`` that moved, 0 when none did (also ``specstudy study``'s)."""
    golden = json.loads(golden_path.read_text())
    machine = machine_of(study)  # type: ignore[arg-type]
    moved = compare(golden, rows, rel_tol, machine)
    extra = new_rows(golden, rows)
    if as_json:
        shown = [{**m.__dict__, "row": row_name(m.row), "reason": moved_text(m)} for m in moved]
        print(json.dumps({"moved": shown, "new_rows": [row_name(k) for k in extra], "checked": len(golden["rows"])}))
    else:
        for m in moved:
            print(f"MOVED  {row_name(m.row)}: {moved_text(m)}")
        for key in extra:
            print(f"new    {row_name(key)} (not in the golden; not checked)")
        tol = tolerance_for(golden, machine, rel_tol)
        print(f"{len(golden['rows'])} golden rows checked at rel_tol {tol:g}, {len({m.row for m in moved})} moved")
    return 1 if moved else 0
