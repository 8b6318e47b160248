"""specstudy report: execute the study notebooks (papermill) and render outputs/<gpu>/report.md."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = "render outputs/<gpu>/report.md (+ HTML) from the records, executing the notebooks; or merge several"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hardware", "--gpu", dest="hardware", default="cpu", help="which outputs/<hardware>/ to report")
    p.add_argument("--outputs", default="outputs", help="outputs root (default outputs)")
    p.add_argument("--no-notebooks", action="store_true",
                   help="write report.md directly, without executing the notebooks through papermill")
    p.add_argument("--merge", nargs="+", default=None, metavar="DIR",
                   help="cross-hardware report over several outputs/<gpu>/ folders (written to --dest)")
    p.add_argument("--dest", default=None, help="folder of the cross-hardware report (default <outputs>/cross-hardware)")


def run(args: argparse.Namespace) -> int:
    from ..report import execute_notebooks, plan_notebook_jobs, write_cross_report, write_report

    if args.merge:
        missing = [d for d in args.merge if not (Path(d) / "records").is_dir()]
        if missing:
            raise FileNotFoundError(f"--merge {missing[0]}: no records folder there; allowed: outputs/<gpu>/ folders "
                                    f"written by `specstudy run`")
        path = write_cross_report(args.merge, args.dest or Path(args.outputs) / "cross-hardware")
        print(json.dumps({"report": str(path)}) if args.json else f"cross-hardware report: {path}")
        return 0
    out = Path(args.outputs) / args.hardware
    if not (out / "records").is_dir():
        raise FileNotFoundError(f"{out}/records does not exist: run `specstudy run --hardware {args.hardware}` first")
    if args.no_notebooks or not (out / "study.json").exists():
        path = write_report(out)
        errors = []
    else:
        results = execute_notebooks(plan_notebook_jobs(out))
        errors = [(j.name, e) for j, e in results if e]
        path = out / "report.md"
    if args.json:
        print(json.dumps({"report": str(path), "html": str(path.with_suffix(".html")),
                          "notebook_errors": [{"notebook": n, "error": e} for n, e in errors]}, indent=2))
    else:
        print(f"report: {path}")
        for n, e in errors:
            print(f"notebook {n} FAILED: {e}")
    return 1 if errors else 0
