"""specstudy report: execute the study notebooks (papermill) and render outputs/<gpu>/report.md."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from ..analysis.cost import PRICE_ENV
from ..layout import StudyLayout
from ..report.notebooks import execute_notebooks, plan_notebook_jobs
from ..report.writer import write_cross_report, write_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hardware", "--gpu", dest="hardware", default="cpu", help="which outputs/<hardware>/ to report")
    p.add_argument("--outputs", default="outputs", help="outputs root (default outputs)")
    p.add_argument(
        "--no-notebooks",
        action="store_true",
        help="write report.md directly, without executing the notebooks through papermill",
    )
    p.add_argument(
        "--merge",
        nargs="+",
        default=None,
        metavar="DIR",
        help="cross-hardware report over several outputs/<gpu>/ folders (written to --dest)",
    )
    p.add_argument(
        "--price-per-hour",
        type=float,
        default=None,
        metavar="USD",
        help="US$ per GPU-hour (the whole machine on a CPU) for $ per million tokens, instead of the hardware "
        "profile's stated price",
    )
    p.add_argument(
        "--dest", default=None, help="folder of the cross-hardware report (default <outputs>/cross-hardware)"
    )


def run(args: argparse.Namespace) -> int:
    if args.price_per_hour is not None:
        if not args.price_per_hour > 0:
            raise ValueError(f"--price-per-hour={args.price_per_hour}: allowed a positive number of US$ per GPU-hour")
        os.environ[PRICE_ENV] = repr(args.price_per_hour)  # the notebooks run in subprocesses and inherit it
    if args.merge:
        missing = [d for d in args.merge if not StudyLayout(Path(d)).records_dir.is_dir()]
        if missing:
            raise FileNotFoundError(
                f"--merge {missing[0]}: no records folder there; allowed: outputs/<gpu>/ folders "
                f"written by `specstudy run`"
            )
        path = write_cross_report(args.merge, args.dest or Path(args.outputs) / "cross-hardware")
        print(json.dumps({"report": str(path)}) if args.json else f"cross-hardware report: {path}")
        return 0
    layout = StudyLayout.of(args.hardware, args.outputs)
    if not layout.records_dir.is_dir():
        raise FileNotFoundError(
            f"{layout.records_dir} does not exist: run `specstudy run --hardware {args.hardware}` first"
        )
    plan = layout.read_plan()
    if args.no_notebooks or not plan:
        path = write_report(layout.root)
        errors = []
    else:
        jobs = plan_notebook_jobs(layout.root, plan["cells"], plan.get("config", {}).get("notebooks"))
        errors = [(j.name, e) for j, e in execute_notebooks(jobs) if e]
        path = layout.report_path
    if args.json:
        print(
            json.dumps(
                {
                    "report": str(path),
                    "html": str(path.with_suffix(".html")),
                    "notebook_errors": [{"notebook": n, "error": e} for n, e in errors],
                },
                indent=2,
            )
        )
    else:
        print(f"report: {path}")
        for n, e in errors:
            print(f"notebook {n} FAILED: {e}")
    return 1 if errors else 0
