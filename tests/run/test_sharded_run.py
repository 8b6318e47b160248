"""A sharded study through submitit's LocalExecutor: every shard a real subprocess on a tiny plan.

Two engines (reference and hf, both served here by the tiny random model) make two shards.  The
tests check the records against a run in this process, resume after a shard's job is killed
mid-run (its finished cells kept, only its missing cells run again, the other shard not resubmitted),
a failed cell reported with its error, and Ctrl-C on a local study printing one line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import TINY_STUDY, TinyFactory, run_tiny_study, tiny_requests, write_study

from specstudy.config import load_study
from specstudy.config.cluster import ClusterSpec
from specstudy.layout import StudyLayout
from specstudy.run.plan import expand
from specstudy.run.shards import plan_shards
from specstudy.run.slurm import StudyRef, finished, follow, make_executor, run_sharded, submit_shards

TWO_ENGINES = (
    TINY_STUDY.replace("frameworks: [reference]", "frameworks: [reference, hf]")
    .replace("    - {method: layer_skip, label: Early exit, options: {exit_layer: 1}, max_batch_size: 1}\n", "")
    .replace("batch_sizes: [1, 2]", "batch_sizes: [1]")
)
TESTS = Path(__file__).parents[1]
#: two shard subprocesses, each importing torch and building the tiny model: ~35 s on 2 shared cores
SUBPROCESS_SHARDS = pytest.mark.slow


@pytest.fixture
def study(tmp_path, monkeypatch):
    # the jobs unpickle the tests' factory and prompts: the subprocesses import them from here
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    yaml = write_study(tmp_path, TWO_ENGINES)
    cfg = load_study("cpu", yaml)
    plans = expand(cfg)
    shards = plan_shards(cfg, plans, None, ClusterSpec())
    ref = StudyRef(hardware="cpu", params=str(yaml), outputs=str(tmp_path / "out"))
    return cfg, plans, shards, ref


def _in_subprocesses(study, lines, **factory_kw):
    """The study's shards through the LocalExecutor, the tiny model and prompts; no report."""
    cfg, _, shards, ref = study
    return run_sharded(
        cfg,
        shards,
        ClusterSpec(),
        ref,
        "subprocess",
        lines.append,
        report=False,
        factory=TinyFactory(**factory_kw),
        request_loader=tiny_requests,
    )


def _outputs(layout):
    return {(r.cell_id, r.prompt_id): list(r.output_ids or []) for r in layout.read_all()}


@SUBPROCESS_SHARDS
def test_shards_as_subprocesses_write_what_a_local_run_writes(study, tmp_path):
    cfg, plans, shards, ref = study
    assert len(shards) == 2 and {s.plans[0].cell.framework for s in shards} == {"reference", "hf"}
    lines: list[str] = []
    rc = _in_subprocesses(study, lines)
    assert rc == 0, lines
    assert sum("done (" in line for line in lines) == 2
    local = StudyLayout(tmp_path / "local")
    run_tiny_study(cfg, plans, local.root, TinyFactory())
    sharded = ref.layout()
    assert sorted(p.stem for p in sharded.part_paths()) == sorted(p.cell_id for p in plans)
    assert _outputs(sharded) == _outputs(local)  # same cells, prompts and greedy outputs
    assert all(_outputs(local).values())
    assert (sharded.jobs_dir / f"{shards[0].name}.log").exists()  # each shard's run log under the study
    # a rerun finds every cell on disk and submits nothing
    again: list[str] = []
    assert run_sharded(cfg, shards, ClusterSpec(), ref, "subprocess", again.append, report=False) == 0
    assert any("nothing to submit" in line for line in again)


@SUBPROCESS_SHARDS
def test_a_killed_shard_keeps_its_finished_cells_and_a_rerun_runs_only_its_missing_ones(study):
    cfg, plans, shards, ref = study
    layout = ref.layout()
    executor = make_executor("subprocess", layout, ClusterSpec())
    lines: list[str] = []
    sub = submit_shards(
        "subprocess",
        executor,
        ClusterSpec(),
        ref,
        shards,
        lines.append,
        factory=TinyFactory(delay_s=0.5),
        request_loader=tiny_requests,
    )
    victim, job = sub.jobs[shards[0].name]
    deadline = time.time() + 600  # a hang guard: a busy machine (make test beside a busy loop) is slow
    while time.time() < deadline and not any(layout.is_done(c) for c in victim.cell_ids):
        assert not finished(job), job.stderr()
        time.sleep(0.1)
    _kill_tree(job._process.pid)
    report: list[str] = []
    assert follow(sub, ref, report.append, poll_s=0.2, report=False) == 3
    kept = [c for c in victim.cell_ids if layout.is_done(c)]
    missing = victim.missing(layout)
    assert kept and missing, "the kill must land mid-shard"
    head = next(line for line in report if line.startswith(victim.name))
    assert f"{len(missing)} of {len(victim.plans)} cells missing" in head
    assert all(any(c in line and "not run" in line for line in report) for c in missing)
    assert any("its log" in line for line in report)
    other = shards[1]
    assert not other.missing(layout)
    before = {c: layout.part_path(c).stat().st_mtime_ns for c in kept + other.cell_ids}
    again: list[str] = []
    rc = _in_subprocesses(study, again)
    assert rc == 0, again
    submitted = [line for line in again if ": job " in line]
    assert len(submitted) == 1 and submitted[0].startswith(victim.name)
    assert f"{len(missing)} of {len(victim.plans)} cells to run" in submitted[0]
    assert {c: layout.part_path(c).stat().st_mtime_ns for c in before} == before
    keys = [(r.cell_id, r.prompt_id) for r in layout.read_all()]
    assert len(keys) == len(set(keys)) == sum(p.prompts for p in plans)


def _kill_tree(pid: int) -> None:
    """SIGKILL a job's process and its children (what scancel does after KillWait)."""
    import psutil

    proc = psutil.Process(pid)
    for p in [*proc.children(recursive=True), proc]:
        p.kill()


@SUBPROCESS_SHARDS
def test_a_cell_that_fails_in_a_shard_is_reported_with_its_error(study):
    cfg, plans, shards, ref = study
    lines: list[str] = []
    rc = _in_subprocesses(study, lines, fail_method="ngram")
    assert rc == 3
    ngram = [p.cell_id for p in plans if p.cell.method == "ngram"]
    for cid in ngram:
        assert any(cid in line and "Error" in line for line in lines), lines
    assert all(ref.layout().is_done(p.cell_id) for p in plans if p.cell.method == "ar")


INTERRUPT_SCRIPT = """
import signal, sys
# a shell's background job (`make test &`, nohup) starts with SIGINT ignored, which Python then keeps:
# restore Ctrl-C's default so the test does not depend on how pytest was started
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path[:0] = [{tests!r}]
from support import TinyFactory, tiny_requests
import specstudy.run.pool as pool, specstudy.run.study_runner as study
pool._default_factory = TinyFactory(hold=({hold!r}, 5))
study.study_request_loader = lambda cfg: lambda task, n, seed, tok: tiny_requests(task, n, seed, tok)
from specstudy.cli import main
sys.exit(main(["run", "--params", {yaml!r}, "--outputs", {out!r}, "--no-progress"]))
"""


def test_ctrl_c_on_a_local_study_prints_one_line_with_what_is_kept_and_the_resume_command(tmp_path):
    yaml = write_study(tmp_path, TWO_ENGINES)
    out = tmp_path / "out"
    script = tmp_path / "run.py"
    # the fake engine touches it at the 5th measured call: the first AR cell and its twin took 2 prompts x 2 arms
    hold = tmp_path / "second-group-in-flight"
    script.write_text(INTERRUPT_SCRIPT.format(tests=str(TESTS), yaml=str(yaml), out=str(out), hold=str(hold)))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SPECSTUDY_COMMAND": "make study GPU=tiny"}
    proc = subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    layout = StudyLayout(out / "cpu")
    deadline = time.time() + 600  # a hang guard: a busy machine (make test beside a busy loop) is slow
    while time.time() < deadline and not hold.exists():
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    assert hold.exists(), "the study never reached its second group of cells"
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stdout + stderr
    # one line beside the warnings (a loaded test machine earns a busy one; a fresh machine, the tokenizer's fetch)
    lines = [x for x in stderr.strip().splitlines() if not x.startswith("specstudy run: warning: ")]
    assert len(lines) == 1, stderr
    kept = len(layout.part_paths())
    assert kept == 2  # the first AR cell and its twin; the second group was in flight
    assert lines[0] == (
        f"specstudy run: interrupted; {kept} of {len(expand(load_study('cpu', yaml)))} cells are kept in "
        f"{layout.records_dir} (the cells in flight are not); resume with: make study GPU=tiny"
    )
