"""How long `specstudy study --dry-run` (what `make study` plans first) takes per hardware profile, against its 5 s target.  (A benchmark,
not a test: tests/run/test_dryrun.py checks what the dry run says; this prints how fast it said it.)

Per profile, ``--repeats`` times, the command a user types, in a fresh interpreter, offline as the
test runs it (an empty ``HF_HOME``, no hub, no engine environments):

    python -m specstudy.cli run --hardware H --dry-run --json

Two figures: the wall time of the whole command (interpreter start-up and imports included: what
the user waits for) and the ``validated_in_s`` the command reports (the study's validation alone,
every cell through its engine's own check, before any model loads).  Each against the target: the
README and the Makefile promise a dry run "< 5 s".  Medians and the worst over the repeats.

    .venv/bin/python bench/dryrun.py [--hardware cpu,h200] [--repeats 3] [--json]

Timing: run it on a quiet machine; the load average is printed beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specstudy.config import hardware_names  # noqa: E402

#: seconds: the dry run's promise (README, Makefile), for the whole command and for its validation
TARGETS = {"wall_s": 5.0, "validated_in_s": 5.0}


def dry_run_once(hardware: str, hf_home: str) -> dict[str, Any]:
    """One dry run in a fresh interpreter: its wall time and what it reported."""
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "",
        "HF_HOME": hf_home,
        "SPECSTUDY_ENGINES_PYTHON": "",  # no engine environments: the dry run must not need them
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
    }
    t0 = time.perf_counter()
    r = subprocess.run(
        [sys.executable, "-m", "specstudy.cli", "study", "--hardware", hardware, "--dry-run", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=ROOT,
    )
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"dry run of {hardware!r} exited {r.returncode}: {r.stderr[-2000:]}")
    doc = json.loads(r.stdout)
    return {"wall_s": wall, "validated_in_s": float(doc["validated_in_s"]), "cells": int(doc["cells"])}


def bench(profiles: Sequence[str], repeats: int) -> dict[str, Any]:
    """Every profile ``repeats`` times, interleaved (the machine's speed drifts); medians, worst, ratios."""
    runs: dict[str, list[dict[str, Any]]] = {h: [] for h in profiles}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as hf_home:
        for _ in range(repeats):
            for h in profiles:
                runs[h].append(dry_run_once(h, hf_home))
    rows = []
    for h, rs in runs.items():
        row: dict[str, Any] = {"hardware": h, "cells": rs[0]["cells"], "repeats": len(rs)}
        for key, target in TARGETS.items():
            vals = [r[key] for r in rs]
            med, worst = statistics.median(vals), max(vals)
            row[key] = {"median": med, "worst": worst, "target": target, "median_over_target": med / target}
            row[key]["met"] = {"median": med < target, "worst": worst < target}
        rows.append(row)
    return {"repeats": repeats, "load_avg": [load_before, os.getloadavg()], "targets": TARGETS, "rows": rows}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options; unknown profiles are refused before anything runs."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="all", help="comma-separated profiles (default: every profile)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print the full result as JSON")
    a = ap.parse_args(argv)
    known = hardware_names()
    a.profiles = list(known) if a.hardware == "all" else [h.strip() for h in a.hardware.split(",") if h.strip()]
    unknown = sorted(set(a.profiles) - set(known))
    if unknown or not a.profiles:
        ap.error(f"--hardware {a.hardware!r}: unknown {unknown}; known: {list(known)}")
    if a.repeats < 1:
        ap.error(f"--repeats {a.repeats}: need >= 1")
    return a


def show(res: dict[str, Any]) -> None:
    """One line per profile (medians, worst, median / target), then which targets every run met."""
    before, after = res["load_avg"]
    print(
        f"specstudy study --dry-run, {res['repeats']} repeat(s) per profile, load average {before[0]:.2f} -> "
        f"{after[0]:.2f}"
    )
    print(
        f"{'profile':14} {'cells':>6} {'wall s':>8} {'worst':>7} {'/targ':>6} {'valid. s':>9} {'worst':>7} {'/targ':>6}"
    )
    for r in res["rows"]:
        w, v = r["wall_s"], r["validated_in_s"]
        print(
            f"{r['hardware']:14} {r['cells']:>6} {w['median']:8.2f} {w['worst']:7.2f} {w['median_over_target']:6.2f} "
            f"{v['median']:9.3f} {v['worst']:7.3f} {v['median_over_target']:6.2f}"
        )
    for key, target in res["targets"].items():
        missed = [r["hardware"] for r in res["rows"] if not r[key]["met"]["worst"]]
        print(
            f"{key} < {target:g} s: " + (f"MISSED by {', '.join(missed)} (worst run)" if missed else "met by every run")
        )


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    res = bench(a.profiles, a.repeats)
    if a.json:
        print(json.dumps(res, indent=1))
    else:
        show(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
