"""specstudy study: the whole study in one command: the cells, the notebooks and report, the acceptance gate.

``make study`` and every ``make study-*`` target are one line over it.  Locally and with
``--executor slurm|subprocess`` alike: the cells run (resumed), then the notebooks execute (only those
older than the records) and write the report, then the greedy reference-engine rows are checked against
the committed golden when one exists.  One exit code says which stage failed first; the closing line
names each stage's outcome.  Submitted with ``--no-wait``, the shards' report job renders the report,
and the same command run again after them checks the gate.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ..analysis.cost import PRICE_ENV
from ..layout import StudyLayout
from ..paths import REPO_ROOT
from . import run_command

#: exit status when every cell ran but a notebook (the report included) failed
EXIT_NOTEBOOKS_FAILED = 4
#: exit status when the acceptance gate names a row that moved
EXIT_GOLDEN_MOVED = 5


def add_arguments(p: argparse.ArgumentParser) -> None:
    run_command.add_arguments(p)
    s = p.add_argument_group("after the cells")
    s.add_argument("--notebook-jobs", type=int, default=2, metavar="N", help="notebooks executed at a time (default 2)")
    s.add_argument(
        "--golden",
        default=None,
        metavar="FILE",
        help="the acceptance gate's golden (default params/golden/<hardware>.json when it exists; 'none' skips it)",
    )
    s.add_argument(
        "--price-per-hour",
        type=float,
        default=None,
        metavar="USD",
        help="US$ per GPU-hour (the whole machine on a CPU) for $ per million tokens, instead of the profile's price",
    )


def _problems(args: argparse.Namespace) -> list[str]:
    out = []
    if args.notebook_jobs < 1:
        out.append(f"--notebook-jobs={args.notebook_jobs}: allowed a whole number >= 1")
    if args.price_per_hour is not None and not args.price_per_hour > 0:
        out.append(f"--price-per-hour={args.price_per_hour}: allowed a positive number of US$ per GPU-hour")
    if args.golden not in (None, "none") and not Path(args.golden).is_file():
        out.append(f"--golden={args.golden}: no such file; allowed: a golden written by `make golden`, or 'none'")
    return out


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3]) if Path("/proc/loadavg").exists() else "n/a"


def render(layout: StudyLayout, workers: int, say: Callable[[str], None] = print) -> list[tuple[str, str]]:
    """The notebooks older than the records, executed; returns (notebook, error) for each that failed."""
    from ..report.notebooks import execute_notebooks, plan_notebook_jobs, stale_jobs

    plan = layout.read_plan()
    if not plan:
        return [("report", f"{layout.plan_path} is missing: no cell was planned")]
    jobs = plan_notebook_jobs(layout.root, plan["cells"], plan.get("config", {}).get("notebooks"))
    todo = stale_jobs(jobs, layout.records_stamp)
    say(f"notebooks: {len(todo)} of {len(jobs)} to execute ({len(jobs) - len(todo)} newer than the records)")
    return [(j.name, e) for j, e in execute_notebooks(todo, say, workers) if e]


def gate(layout: StudyLayout, golden: Path, as_json: bool = False) -> int:
    """The acceptance gate on the greedy reference-engine rows (exact: the engine is deterministic)."""
    from ..analysis.golden import acceptance_rows
    from ..analysis.study_records import load
    from .check_command import check_golden

    study = load(layout.root)
    return check_golden(study, acceptance_rows(study, ["reference"], True), golden, None, as_json)


def run(args: argparse.Namespace) -> int:
    problems = _problems(args)
    if problems:
        raise ValueError("; ".join(problems))
    if args.price_per_hour is not None:
        os.environ[PRICE_ENV] = repr(args.price_per_hour)  # the notebooks run in subprocesses and inherit it
    t0, load0 = time.time(), _load()
    say = print if not args.json else (lambda m: print(m, file=sys.stderr, flush=True))  # --json: stdout is JSON
    say(f"specstudy study {args.hardware}: start {time.strftime('%FT%TZ', time.gmtime(t0))}, load average {load0}")
    golden_name = args.hardware  # the profile's own golden (a rehearsal never has one)
    rc_cells = run_command.run(args)  # a rehearsal renames args.hardware to its own folder
    if args.dry_run or rc_cells not in (0, run_command.EXIT_CELLS_FAILED):
        return rc_cells
    layout = StudyLayout.of(args.hardware, args.outputs)
    if args.executor != "local" and args.no_wait:
        say(
            "specstudy study: the shards run on; the report job renders the report after them. Run this same "
            "command again once they are done: it submits nothing new, renders what is stale and checks the gate."
        )
        return rc_cells
    # what is stale only: followed shards that all succeeded have rendered it already (run_sharded)
    failed_nb = render(layout, args.notebook_jobs, say)
    golden = (
        None if args.golden == "none" else Path(args.golden or REPO_ROOT / "params" / "golden" / f"{golden_name}.json")
    )
    rc_gate = gate(layout, golden, args.json) if golden is not None and golden.is_file() and not args.rehearse else None
    stages = [
        ("cells", "ok" if rc_cells == 0 else f"some failed (see {layout.root / 'failed'}; a rerun retries only them)"),
        ("notebooks", "ok" if not failed_nb else "failed: " + ", ".join(n for n, _ in failed_nb)),
        (
            "golden",
            "not checked (none for this profile)" if rc_gate is None else "ok" if rc_gate == 0 else "rows moved",
        ),
    ]
    say(f"report: {layout.report_path} ({layout.report_path.with_suffix('.html').name}, .pdf)")
    say("specstudy study: " + "; ".join(f"{k} {v}" for k, v in stages))
    say(f"specstudy study {args.hardware}: {time.time() - t0:.0f} s wall, load average {load0} -> {_load()}")
    if rc_cells:
        return rc_cells
    if failed_nb:
        return EXIT_NOTEBOOKS_FAILED
    return EXIT_GOLDEN_MOVED if rc_gate else 0
