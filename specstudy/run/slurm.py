"""A sharded study as cluster jobs through submitit: one job per shard, the report job after them.

Each shard's job rebuilds the study from its file on the node and runs its missing cells through
:func:`specstudy.run.study_runner.run_study` into the shared ``outputs/<hw>/`` (one atomic part per cell,
so shards never write the same file).  On Slurm the report job depends on every shard
(``afterok``); elsewhere the submitter runs it when the shards are done.  A rerun submits only
shards with cells missing on disk and skips shards whose job is still queued or running; a job
that was cancelled, preempted or timed out keeps every cell it finished.  The submitter follows
the jobs and says, for a shard that failed, which cells are missing and why (its log's last lines).
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config import StudyConfig
from ..config.cluster import ClusterSpec
from ..layout import StudyLayout, atomic_write_text
from .shards import Shard

#: job states after which a job runs no more (Slurm's names; submitit's local jobs say FINISHED/FAILED)
ACTIVE_STATES = ("PENDING", "RUNNING", "REQUEUED", "RESIZING", "SUSPENDED", "CONFIGURING", "COMPLETING")
#: log lines a failure report quotes
LOG_TAIL = 6


@dataclass(frozen=True)
class StudyRef:
    """What a job needs to rebuild the study on its node (all paths absolute: the node's cwd differs)."""

    hardware: str
    params: str | None
    outputs: str

    def layout(self) -> StudyLayout:
        return StudyLayout.of(self.hardware, self.outputs)


def shard_job(
    ref: StudyRef, shard: str, cell_ids: Sequence[str], factory: Any = None, request_loader: Any = None
) -> dict[str, Any]:
    """Run one shard's cells not yet on disk (on the node); returns what ran and what failed.

    ``factory`` and ``request_loader`` replace the engines and prompts (tests); default: the study's own.
    """
    from .plan import load, uses_cuda
    from .study_runner import run_study

    # unused top-level entries: the submitting command refused or (--allow-unused) warned already
    study = load(ref.hardware, ref.params, files=factory is None, allow_unused=True)
    cfg, all_plans = study.cfg, list(study.plans)
    wanted = set(cell_ids)
    plans = [p for p in all_plans if p.cell_id in wanted]
    unknown = sorted(wanted - {p.cell_id for p in plans})
    if unknown:  # the study file changed since submission: say so rather than run something else
        raise RuntimeError(f"shard {shard}: cells {unknown[:3]} are no longer in {cfg.file}; rerun the submission")
    results = run_study(
        cfg,
        plans,
        ref.layout(),
        factory=factory,
        request_loader=request_loader,
        progress=False,
        log=lambda m: print(m, flush=True),
        full_plan=all_plans,
        cuda=uses_cuda(cfg),
        shard=shard,
    )
    return {
        "shard": shard,
        "done": sum(r.status == "done" for r in results),
        "skipped": sum(r.status == "skipped" for r in results),
        "failed": [{"cell_id": r.cell_id, "error": r.message} for r in results if r.status == "failed"],
    }


def report_job(ref: StudyRef) -> list[str]:
    """After the shards: the plan with every shard's precision extensions, then the notebooks and report
    (what ``specstudy report`` runs); returns the notebooks run, raises naming those that failed."""
    from ..config import load_study
    from ..report.notebooks import execute_notebooks, plan_notebook_jobs
    from .plan import expand
    from .precision import extensions
    from .study_runner import write_plan

    cfg = load_study(ref.hardware, ref.params, allow_unused=True)  # the submitter refused or warned already
    layout, plans = ref.layout(), expand(cfg)
    on_disk, _ = extensions(cfg, plans, layout)
    write_plan(layout, cfg, [*plans, *on_disk])
    layout.records_stamp.touch()
    jobs = plan_notebook_jobs(layout.root, layout.read_plan()["cells"], cfg.notebooks)
    failed = [f"{j.name}: {e}" for j, e in execute_notebooks(jobs) if e]
    if failed:
        raise RuntimeError("notebooks failed: " + "; ".join(failed))
    return [j.name for j in jobs]


def make_executor(kind: str, layout: StudyLayout, cluster: ClusterSpec) -> Any:
    """A submitit executor writing its scripts and logs under the study's ``jobs/`` folder."""
    import submitit

    folder = layout.jobs_dir / "%j"
    if kind == "slurm":
        return submitit.AutoExecutor(folder=folder, cluster="slurm", slurm_python=cluster.python)
    return submitit.AutoExecutor(folder=folder, cluster="local")


def _index(layout: StudyLayout) -> dict[str, Any]:
    path = layout.jobs_index_path
    return json.loads(path.read_text()) if path.exists() else {"shards": {}}


def _attach(kind: str, layout: StudyLayout, job_id: str) -> Any:
    """A submitted Slurm job again, from its id (submitit asks sacct for its state)."""
    import submitit

    return submitit.SlurmJob(folder=layout.jobs_dir / "%j", job_id=job_id)


def job_state(job: Any) -> str:
    """A job's state: submitit's (sacct's on Slurm), else, on a Slurm without accounting, the
    controller's own (``scontrol show job``, which keeps a finished job for MinJobAge)."""
    state = str(job.state).split()[0] if str(job.state) else "UNKNOWN"
    if state != "UNKNOWN" or job.__class__.__name__ != "SlurmJob":
        return state
    out = subprocess.run(["scontrol", "show", "job", "-o", str(job.job_id)], capture_output=True, text=True)
    found = re.search(r"JobState=(\S+)", out.stdout)
    return found.group(1) if found else "UNKNOWN"


def finished(job: Any) -> bool:
    """The job runs no more: its result is written, or its state is final."""
    return bool(job.paths.result_pickle.exists()) or job_state(job) not in (*ACTIVE_STATES, "UNKNOWN")


def quiet_without_accounting() -> None:
    """A Slurm without accounting makes submitit warn at every poll that sacct failed: say it once."""
    import submitit  # noqa: F401  (its import configures its logger: set the level after it)

    ok = subprocess.run(["sacct", "-n", "-j", "1"], capture_output=True).returncode == 0
    if not ok:
        logging.getLogger("submitit").setLevel(logging.ERROR)


def still_active(kind: str, layout: StudyLayout) -> dict[str, str]:
    """Shard name → job id of the shards whose last submitted Slurm job is queued or running."""
    if kind != "slurm":
        return {}
    out = {}
    for name, entry in _index(layout)["shards"].items():
        if job_state(_attach(kind, layout, entry["job_id"])) in ACTIVE_STATES:
            out[name] = entry["job_id"]
    return out


@dataclass
class Submission:
    """The jobs of one submission: shards (name → (shard, job)) and the report job."""

    kind: str
    layout: StudyLayout
    jobs: dict[str, tuple[Shard, Any]]
    report: Any = None

    def ids(self) -> list[str]:
        return [str(j.job_id) for _, j in self.jobs.values()] + ([str(self.report.job_id)] if self.report else [])

    def follow_hint(self) -> str:
        ids = self.ids()
        if self.kind == "slurm":
            return (
                f"follow: squeue -j {','.join(ids)} (logs: {self.layout.jobs_dir}/<job id>/); "
                f"cancel: scancel {' '.join(ids)}"
            )
        return f"logs: {self.layout.jobs_dir}/<pid>/; cancel: kill {' '.join(ids)}"


def submit_shards(
    kind: str,
    executor: Any,
    cluster: ClusterSpec,
    ref: StudyRef,
    shards: Sequence[Shard],
    say: Callable[[str], None],
    *,
    factory: Any = None,
    request_loader: Any = None,
    report_job_wanted: bool = True,
) -> Submission:
    """Submit every shard with missing cells (not one still queued or running) and, on Slurm and when
    ``report_job_wanted`` (nobody follows the shards here), the report job."""
    layout = ref.layout()
    layout.jobs_dir.mkdir(parents=True, exist_ok=True)
    active = still_active(kind, layout)
    sub = Submission(kind, layout, {})
    index = _index(layout)
    for s in shards:
        missing = s.missing(layout)
        if not missing:
            continue
        if s.name in active:
            say(f"{s.name}: job {active[s.name]} is still queued or running; not submitted again")
            continue
        params = {**cluster.submitit_parameters(), "name": s.name, "gpus_per_node": s.gpus}
        if kind != "slurm":
            params = {"timeout_min": cluster.time_limit_min, "name": s.name, "gpus_per_node": s.gpus}
        executor.update_parameters(**params)
        job = executor.submit(shard_job, ref, s.name, missing, factory, request_loader)
        sub.jobs[s.name] = (s, job)
        index["shards"][s.name] = {"job_id": str(job.job_id), "cells": missing, "time": time.strftime("%FT%T")}
        say(
            f"{s.name}: job {job.job_id}, {len(missing)} of {len(s.plans)} cells to run, {s.gpus} GPU(s), "
            f"{cluster.cpus_per_task} CPUs, predicted {s.predicted_s / 60:.1f} min of {cluster.time_limit_min}"
        )
    if sub.jobs and kind == "slurm" and report_job_wanted:
        after = ":".join(str(j.job_id) for _, j in sub.jobs.values())
        params = {**cluster.submitit_parameters(), "name": "report", "gpus_per_node": 0}
        # never left pending when a shard failed: Slurm drops it, and a rerun submits it again
        params["slurm_additional_parameters"] = {**params["slurm_additional_parameters"], "kill_on_invalid_dep": "yes"}
        executor.update_parameters(**params, slurm_dependency=f"afterok:{after}")
        sub.report = executor.submit(report_job, ref)
        index["report"] = str(sub.report.job_id)
        say(f"report: job {sub.report.job_id}, starts after the shards succeed (or `make report` later)")
    atomic_write_text(layout.jobs_index_path, json.dumps(index, indent=1))
    return sub


def failure_lines(shard: Shard, job: Any, layout: StudyLayout) -> list[str]:
    """A failed shard: its state, the cells it left missing and why, as its own log says."""
    missing = shard.missing(layout)
    failed = {d["cell_id"]: d.get("error", "") for d in layout.failed_cells()}
    state = job_state(job)
    lines = [f"{shard.name} (job {job.job_id}) {state}: {len(missing)} of {len(shard.plans)} cells missing"]
    lines += [f"  {cid}: {failed.get(cid, 'not run (the job ended before it)')}" for cid in missing]
    log = "\n".join(t for t in (_read(job, "stdout"), _read(job, "stderr")) if t)
    tail = [line for line in log.splitlines() if line.strip()][-LOG_TAIL:]
    if tail:
        lines.append(f"  its log ({Path(job.paths.stderr)}) ends:")
        lines += [f"    {line}" for line in tail]
    return lines


def _result(job: Any) -> dict[str, Any] | None:
    """What the shard's function returned; None when it raised or the job ended before it returned."""
    if not job.paths.result_pickle.exists():
        return None
    try:
        return dict(job.result())
    except Exception:  # submitit re-raises the job's own error (its log says which)
        return None


def _read(job: Any, what: str) -> str:
    try:
        return str(getattr(job, what)() or "")
    except OSError:
        return ""


def follow(sub: Submission, ref: StudyRef, say: Callable[[str], None], poll_s: float = 2.0, report: bool = True) -> int:
    """Wait for the jobs, one line per finished shard; 0 when every cell is on disk, else 3.

    Elsewhere than on Slurm the report runs here (``report``), after the shards succeeded.
    """
    pending = dict(sub.jobs)
    bad = 0
    while pending:
        for name, (shard, job) in list(pending.items()):
            if not finished(job):
                continue
            del pending[name]
            result = _result(job)
            if result is not None and not result["failed"] and not shard.missing(sub.layout):
                say(f"{name}: done ({result['done']} cells run, {result['skipped']} already on disk)")
                continue
            bad += 1
            for line in failure_lines(shard, job, sub.layout):
                say(line)
        if pending:
            time.sleep(poll_s)
    if sub.report is not None and bad:
        say(
            f"report: job {sub.report.job_id} will not run (a shard did not succeed); rerun this command to "
            f"run the missing cells, or `specstudy report` renders what is on disk"
        )
    elif sub.report is not None:
        say(f"report: job {sub.report.job_id} ({job_state(sub.report)}) renders {sub.layout.report_path}")
    elif report and sub.jobs and not bad:
        report_job(ref)
    return 3 if bad else 0


def run_sharded(
    cfg: StudyConfig,
    shards: Sequence[Shard],
    cluster: ClusterSpec,
    ref: StudyRef,
    kind: str,
    say: Callable[[str], None] = print,
    wait: bool = True,
    report: bool = True,
    **job_kw: Any,
) -> int:
    """Submit, then follow (``wait``); Ctrl-C while following leaves the jobs running and says how to reach them."""
    if kind == "slurm":
        quiet_without_accounting()
    executor = make_executor(kind, ref.layout(), cluster)
    # followed here, the shards are followed by the report here (as a local study is); left, by a report job
    sub = submit_shards(kind, executor, cluster, ref, shards, say, report_job_wanted=not wait, **job_kw)
    if not sub.jobs:
        say(f"every cell of {len(shards)} shard(s) is on disk in {ref.layout().root}: nothing to submit")
        return 0
    try:  # the hint inside: a Ctrl-C that lands while it prints still leaves the jobs running, said so
        say(sub.follow_hint())
        if not wait:
            return 0
        return follow(sub, ref, say, report=report)
    except KeyboardInterrupt:
        say(f"interrupted: the jobs keep running; {sub.follow_hint()}; rerun the same command to resume")
        return 130
