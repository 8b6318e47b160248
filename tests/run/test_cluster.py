"""The sharded study on a real Slurm: only under ``make test-cluster`` (scripts/test_cluster.sh starts it).

A small CPU study (the embedded SmolLM2 through the reference engine and HF transformers, AR and
prompt lookup) runs once here and once through ``specstudy run --executor slurm`` (two shards, one
per engine, and the report job after them); the records must hold the same cells, prompts and
greedy outputs, and both reports the same tables.  Then a shard is cancelled with ``scancel`` mid-run:
the follower reports its missing cells from its log, and a rerun submits that shard alone, for its
missing cells only, keeping the finished ones.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specstudy.layout import StudyLayout

pytestmark = [
    pytest.mark.cluster,
    pytest.mark.skipif(os.environ.get("SPECSTUDY_SLURM") != "1", reason="needs the Slurm of `make test-cluster`"),
]

STUDY = """
study:
  name: cluster-test
  device: cpu
  models:
    - {name: smollm2, target: smollm2-135m, dtype: float32, params: {target: 134515008}}
  methods:
    - {method: ar, label: Baseline (AR)}
    - {method: ngram, label: Prompt lookup, options: {ngram_min: 1, ngram_max: 3}}
  frameworks: [reference, hf]
  tasks: [code]
  gammas: [2, 4]
  batch_sizes: [1]
  repeats: 1
  warmup: {requests: 1, max_new_tokens: 4}
  sampling: {temperature: 0.0, top_p: 1.0, top_k: 0, seed: 0, ignore_eos: true}
  max_new_tokens: 16
  prompts_per_task: 3
  telemetry_period_s: 0.5
cluster:
  partition: debug
  time_limit_min: 20
  cpus_per_task: 2  # the whole 2-core node: shards one at a time, so neither is busy with the other
"""
SPECSTUDY = [sys.executable, "-m", "specstudy.cli"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}  # one thread: local and job decode alike


def _run(*args: str, outputs: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*SPECSTUDY, *args, "--outputs", str(outputs)], env=ENV, capture_output=True, text=True)
    if check:
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _greedy(layout: StudyLayout) -> dict[tuple[str, str], list[int]]:
    return {(r.cell_id, r.prompt_id): list(r.output_ids or []) for r in layout.read_all()}


def _tables(report: Path) -> list[str]:
    """Each table row's first two columns (labels and n) and every heading: what does not depend on timing.
    The table of stalled cells rerun is left out: a stall is a timing event of one run, not of its layout."""
    out, stalls = [], False
    for line in report.read_text().splitlines():
        if line.startswith("#"):
            out.append(line)
        elif line.startswith("|--") or line.startswith("| ---"):
            continue
        elif line.startswith("|"):
            stalls = stalls or line.startswith("| Cell | First attempt | Rerun |")
            if not stalls:
                out.append("|".join(line.split("|")[:3]))
        else:
            stalls = False
    return out


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    (tmp / "cluster-test.yaml").write_text(STUDY)
    return tmp, tmp / "cluster-test.yaml"


@pytest.fixture(scope="module")
def long_study(tmp_path_factory):
    """The study on two tasks: each shard measures two in-time groups (a group's arms, AR and prompt lookup at
    γ 2 and 4, are committed together), so a cancel after the first group lands mid-shard.  Slurm's SIGTERM
    is bypassed by submitit's job (it waits for the USR2 of a time limit); the KillWait of 5 s of
    scripts/test_cluster.sh then kills it, within the second group's 10-15 s."""
    tmp = tmp_path_factory.mktemp("cluster-long")
    (tmp / "cluster-test.yaml").write_text(STUDY.replace("tasks: [code]", "tasks: [code, chat]"))
    return tmp, tmp / "cluster-test.yaml"


@pytest.fixture(scope="module")
def local_run(study):
    tmp, yaml = study
    _run("run", "--params", str(yaml), "--no-progress", outputs=tmp / "local")
    _run("report", "--hardware", "cpu", outputs=tmp / "local")
    return StudyLayout(tmp / "local" / "cpu")


def test_dry_run_shows_two_shards(study):
    tmp, yaml = study
    out = _run("run", "--params", str(yaml), "--dry-run", "--executor", "slurm", outputs=tmp / "dry").stdout
    assert len([r for r in out.split("## Shards", 1)[1].splitlines() if r.startswith("| s0")]) == 2


def test_a_sharded_slurm_run_matches_a_local_run(study, local_run):
    tmp, yaml = study
    t0 = time.time()
    done = _run("run", "--params", str(yaml), "--executor", "slurm", outputs=tmp / "slurm")
    print(f"sharded run through Slurm: {time.time() - t0:.0f} s\n{done.stdout}")
    layout = StudyLayout(tmp / "slurm" / "cpu")
    index = json.loads(layout.jobs_index_path.read_text())
    assert len(index["shards"]) == 2 and "report" not in index  # a followed run renders the report itself
    assert sum(": done (" in line for line in done.stdout.splitlines()) == 2
    assert _greedy(layout) == _greedy(local_run) and all(_greedy(layout).values())
    assert layout.report_path.exists(), done.stdout
    assert _tables(layout.report_path) == _tables(local_run.report_path)


def test_a_cancelled_shard_is_reported_and_a_rerun_runs_only_its_missing_cells(long_study):
    tmp, yaml = long_study
    outputs = tmp / "cancel"
    follower, layout, deadline = _submit_and_follow(yaml, outputs)
    index = json.loads(layout.jobs_index_path.read_text())
    name, entry = sorted(index["shards"].items())[0]
    while time.time() < deadline and not any(layout.is_done(c) for c in entry["cells"]):
        assert follower.poll() is None, follower.communicate()[0]
        time.sleep(0.1)
    subprocess.run(["scancel", entry["job_id"]], check=True)
    out, _ = follower.communicate(timeout=300)
    out = follower.head + out
    assert follower.returncode == 3, out
    kept = [c for c in entry["cells"] if layout.is_done(c)]
    missing = [c for c in entry["cells"] if c not in kept]
    assert kept and missing, "the cancel must land mid-shard"
    assert re.search(rf"{name} \(job {entry['job_id']}\) CANCELLED\S*: {len(missing)} of 6 cells missing", out), out
    assert all(c in out for c in missing) and "its log" in out
    mtimes = {c: layout.part_path(c).stat().st_mtime_ns for c in kept}
    _wait_gone([e["job_id"] for e in index["shards"].values()], 300)
    again = _run("run", "--params", str(yaml), "--executor", "slurm", outputs=outputs).stdout
    submitted = [line for line in again.splitlines() if re.match(r"s\d{3}-.*: job \d+", line)]
    assert len(submitted) == 1 and submitted[0].startswith(name), again
    assert f"{len(missing)} of 6 cells to run" in submitted[0]
    assert {c: layout.part_path(c).stat().st_mtime_ns for c in kept} == mtimes
    keys = [(r.cell_id, r.prompt_id) for r in layout.read_all()]
    assert len(keys) == len(set(keys)) == 12 * 3
    print(f"cancelled shard {name}: kept {len(kept)} cells, the rerun ran {len(missing)}\n{out}\n{again}")


def _ctrl_c_default() -> None:
    """In the child before it starts: SIGINT at its default, so Python turns it into KeyboardInterrupt.  A
    test run started in the background (``make test-cluster &``) has SIGINT ignored, which a child keeps:
    the follower then ignored the test's Ctrl-C and ran to its end (exit 0, 2026-12-07)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _submit_and_follow(yaml: Path, outputs: Path) -> tuple[subprocess.Popen[str], StudyLayout, float]:
    """``specstudy run --executor slurm`` following its jobs in the background, once it has submitted them:
    its "follow: squeue ..." line, printed after the jobs index is written and just before it starts
    following, is the event waited on (no sleep). The lines read so far are kept on ``follower.head``."""
    layout = StudyLayout(outputs / "cpu")
    cmd = [*SPECSTUDY, "run", "--params", str(yaml), "--executor", "slurm", "--outputs", str(outputs)]
    follower = subprocess.Popen(
        cmd,
        env={**ENV, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=_ctrl_c_default,
    )
    deadline = time.time() + 300
    head = []
    assert follower.stdout is not None
    for line in follower.stdout:  # ends when the command exits without that line
        head.append(line)
        if line.startswith("follow: squeue -j"):
            break
    follower.head = "".join(head)  # type: ignore[attr-defined]
    assert layout.jobs_index_path.exists(), follower.head  # type: ignore[attr-defined]
    return follower, layout, deadline


def _wait_gone(job_ids: list[str], timeout_s: float) -> None:
    """Until none of the jobs is queued or running (squeue lists them no more)."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        listed = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)], capture_output=True, text=True)
        if not listed.stdout.strip():
            return
        time.sleep(1)
    raise AssertionError(f"jobs {job_ids} still queued or running after {timeout_s} s")


def _log_of(layout: StudyLayout, job_id: str) -> str:
    return "\n".join(p.read_text()[-2000:] for p in (layout.jobs_dir / job_id).glob("*.log*"))


def test_ctrl_c_on_the_submitting_command_leaves_the_jobs_running_and_says_how_to_reach_them(study):
    tmp, yaml = study
    outputs = tmp / "interrupt"
    follower, layout, deadline = _submit_and_follow(yaml, outputs)
    follower.send_signal(signal.SIGINT)  # it is following: the line before its follow loop was printed
    out, _ = follower.communicate(timeout=600)
    out = follower.head + out
    index = json.loads(layout.jobs_index_path.read_text())
    ids = [e["job_id"] for e in index["shards"].values()] + ([index["report"]] if "report" in index else [])
    try:
        assert follower.returncode == 130, out
        assert "Traceback" not in out
        line = next(x for x in out.splitlines() if x.startswith("interrupted"))
        assert f"squeue -j {','.join(ids)}" in line and f"scancel {' '.join(ids)}" in line
        listed = subprocess.run(["squeue", "-h", "-o", "%i", "-j", ",".join(ids)], capture_output=True, text=True)
        assert set(listed.stdout.split()) == set(ids)  # still queued or running
    finally:
        subprocess.run(["scancel", *ids], check=False)
        _wait_gone(ids, 120)


def test_each_shard_keeps_its_own_precision_stops_and_the_report_reads_all_of_them(study):
    """A precision target in a sharded study (issue 49): each shard's job extends its own rows toward an
    unreachable ±0.01 % until the prompts run out (3 then 6 prompts), writes ``jobs/<shard>.precision.json``,
    and the study's precision (what the report reads) holds both shards' rows."""
    tmp, _ = study
    yaml = tmp / "cluster-precision.yaml"
    sweeps = (
        "  sweeps:\n    headline:\n      precision: {rel_half_width: 0.0001, max_prompts: 6, step: 3,"
        " min_prompts: 3, budget_s: 600}\ncluster:"
    )
    yaml.write_text(
        STUDY.replace("name: cluster-test", "name: cluster-precision")
        .replace("gammas: [2, 4]", "gammas: [4]")
        .replace("cluster:", sweeps)
    )
    outputs = tmp / "precision"
    done = _run("run", "--params", str(yaml), "--executor", "slurm", outputs=outputs)
    layout = StudyLayout(outputs / "cpu")
    index = json.loads(layout.jobs_index_path.read_text())
    shards = sorted(index["shards"])
    assert len(shards) == 2, done.stdout
    docs = {s: layout.read_precision(s) for s in shards}
    assert all(d.get("cells") for d in docs.values()), (docs, done.stdout)
    frameworks = {s: {cid.split("_")[0] for cid in d["cells"]} for s, d in docs.items()}
    assert sorted(f for fs in frameworks.values() for f in fs) == ["hf", "reference"]  # one engine per shard
    merged = layout.read_precision()
    assert set(merged["cells"]) == {c for d in docs.values() for c in d["cells"]}
    assert {row["stopped"] for row in merged["cells"].values()} == {"prompts exhausted"}
    assert {row["n_prompts"] for row in merged["cells"].values()} == {6}
    spent = sum(d["sweeps"]["headline"]["spent_s"] for d in docs.values())
    assert merged["sweeps"]["headline"]["spent_s"] == pytest.approx(spent, abs=0.01)
    print(f"precision through Slurm: {json.dumps(merged['sweeps'])}\n{done.stdout}")
