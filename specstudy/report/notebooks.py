"""The notebooks of a study: one papermill execution per (notebook × parameter set).

``specstudy study`` executes them (two at a time by default); each notebook displays its
frames, tables and figures, and ``report.ipynb`` writes the report's files.  The exploring
notebooks write nothing, so the report depends on none of them: it is started first (the longest
job, and a broken exploring notebook cannot keep it from being written).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.schema import NOTEBOOKS
from ..config.vocab import METHOD_FAMILIES, TASKS

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent.parent / "notebooks"


@dataclass(frozen=True)
class NotebookJob:
    """One papermill execution: a notebook and one parameter set."""

    notebook: str
    parameters: tuple[tuple[str, Any], ...]
    output: str  # executed notebook path

    @property
    def name(self) -> str:
        return Path(self.output).stem


def notebook_jobs(
    out: str | os.PathLike[str], families: Sequence[str], tasks: Sequence[str], notebooks: Sequence[str] = NOTEBOOKS
) -> list[NotebookJob]:
    """The (notebook × parameter set) matrix of one study: one method_family run per family, one
    task_category run per task, one each of hardware / when_it_fails, then the report (always: a
    study's ``notebooks`` list chooses the exploring notebooks, never whether report.md is written)."""
    out_abs = str(Path(out).resolve())
    nbdir = Path(out) / "notebooks"
    jobs: list[NotebookJob] = []

    def add(nb: str, suffix: str = "", **params: Any) -> None:
        if nb in notebooks or nb == "report":
            jobs.append(
                NotebookJob(
                    nb,
                    tuple(sorted({"out_dir": out_abs, **params}.items())),
                    str(nbdir / f"{nb}{'-' + suffix if suffix else ''}.ipynb"),
                )
            )

    add("hardware")
    for fam in families:
        if fam != "ar":
            add("method_family", fam, family=fam)
    for t in tasks:
        add("task_category", t, task=t)
    add("when_it_fails")
    add("report")
    return jobs


def plan_notebook_jobs(
    out: str | os.PathLike[str], cells: Sequence[Mapping[str, Any]], notebooks: Sequence[str] | None = None
) -> list[NotebookJob]:
    """Jobs for the families and tasks of a plan's cells (``CellPlan.as_dict()`` or ``study.json``'s)."""
    fams = [f for f in METHOD_FAMILIES if f in {c.get("family") or c["cell"]["method"] for c in cells}]
    ts = {c["cell"]["task"] for c in cells}
    tasks = [t for t in TASKS if t in ts] + sorted(ts - set(TASKS))
    return notebook_jobs(out, fams, tasks, notebooks or NOTEBOOKS)


def stale_jobs(jobs: Sequence[NotebookJob], stamp: str | os.PathLike[str]) -> list[NotebookJob]:
    """The jobs whose executed notebook is missing or older than the records (``stamp``) or than the
    notebook itself: a rerun of a finished study executes nothing again."""
    stamp = Path(stamp)
    after = stamp.stat().st_mtime if stamp.exists() else float("inf")

    def fresh(j: NotebookJob) -> bool:
        out = Path(j.output)
        if not out.exists():
            return False
        done = out.stat().st_mtime
        return done >= after and done >= (NOTEBOOKS_DIR / f"{j.notebook}.ipynb").stat().st_mtime

    return [j for j in jobs if not fresh(j)]


def _error_text(stderr: str) -> str:
    """The notebook's own exception, as papermill's last lines name it."""
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    named = [ln for ln in lines if "Error" in ln or "Exception" in ln]
    return (named or lines or ["papermill failed with no message"])[-1].strip()


def papermill_argv(j: NotebookJob, output: str) -> list[str]:
    """papermill's command line for one job (its own CLI, through :mod:`.papermill_cli`)."""
    params = [a for k, v in j.parameters for a in ("-p", k, str(v))]
    return [
        sys.executable,
        "-m",
        "specstudy.report.papermill_cli",
        "--log-level",
        "WARNING",
        "--no-progress-bar",
        "--kernel",
        "python3",
        "--cwd",
        str(NOTEBOOKS_DIR),
        str(NOTEBOOKS_DIR / f"{j.notebook}.ipynb"),
        output,
        *params,
    ]


def execute_notebooks(
    jobs: Sequence[NotebookJob], log: Callable[[str], None] = print, workers: int = 1
) -> list[tuple[NotebookJob, str | None]]:
    """Run the jobs with papermill, ``workers`` at a time (each its own process and kernel), the report
    first; returns (job, error or None) in the jobs' order.  One broken notebook never stops the others,
    and a killed run leaves no half-written notebook (each is written under a temporary name)."""
    from concurrent.futures import ThreadPoolExecutor

    def one(j: NotebookJob) -> tuple[NotebookJob, str | None]:
        Path(j.output).parent.mkdir(parents=True, exist_ok=True)
        tmp = str(Path(j.output).with_suffix(".tmp.ipynb"))
        done = subprocess.run(papermill_argv(j, tmp), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            why = _error_text(done.stderr)
            log(f"notebook {j.name}: FAILED {why}")
            return j, why
        os.replace(tmp, j.output)
        log(f"notebook {j.name}: ok -> {j.output}")
        return j, None

    ordered = sorted(jobs, key=lambda j: j.notebook != "report")  # the longest job, and the one that writes files
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        results = {j.output: why for j, why in pool.map(one, ordered)}
    return [(j, results[j.output]) for j in jobs]
