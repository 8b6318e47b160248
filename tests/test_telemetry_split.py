"""The busy rule's measurement: CPU time outside the study's process tree, live on this machine.

A busy loop the study did not start (an orphan, as a `pip` build beside a study is) must count as
other work; the same loop started by the study (as an engine server is) must count as the study's.
Each expectation is relative to the loop's own CPU time over the window, so a loaded test machine
shifts both sides alike."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from specstudy.cpu_time import others_cores, study_cores
from specstudy.telemetry import TelemetrySampler

LOOP = "import os, sys, time\nprint(os.getpid(), flush=True)\nt = time.time()\nwhile time.time() - t < 3.0: pass"


def _cores(p: psutil.Process, window: float, sampler: TelemetrySampler) -> tuple[float, dict]:
    t0 = p.cpu_times()
    with sampler:
        time.sleep(window)
    t1 = p.cpu_times()
    used = (t1.user + t1.system) - (t0.user + t0.system)
    return used / window, sampler.telemetry.summary()


def test_a_busy_loop_outside_the_study_counts_as_other_work():
    # the shell exits at once: its busy child is reparented away from this process tree
    out = subprocess.run(
        ["sh", "-c", f"{sys.executable} -c '{LOOP}' >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    orphan = psutil.Process(int(out.stdout.split()[-1]))
    assert orphan.pid not in {c.pid for c in psutil.Process().children(recursive=True)}
    loop_cores, summary = _cores(orphan, 1.5, TelemetrySampler(0.25))
    assert loop_cores > 0.2, "the loop never ran: nothing to compare"
    assert summary["cpu_others_cores_mean"] >= 0.8 * loop_cores
    assert summary["cpu_study_cores_mean"] < 0.5 * loop_cores


def test_the_same_loop_started_by_the_study_counts_as_the_study():
    proc = subprocess.Popen([sys.executable, "-c", LOOP], stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        loop_cores, summary = _cores(psutil.Process(proc.pid), 1.5, TelemetrySampler(0.25))
    finally:
        proc.wait()
    assert loop_cores > 0.2, "the loop never ran: nothing to compare"
    assert summary["cpu_study_cores_mean"] >= 0.8 * loop_cores


def test_the_split_over_samples_is_the_difference_of_first_and_last():
    samples = [
        {"t_s": 0.0, "cpu_machine_busy_s": 100.0, "cpu_study_s": 10.0},
        {"t_s": 1.0, "cpu_machine_busy_s": 101.5, "cpu_study_s": 11.0},
        {"t_s": 2.0, "cpu_machine_busy_s": 103.0, "cpu_study_s": 12.0, "gpu": 0},
    ]
    assert others_cores(samples) == 0.5 and study_cores(samples) == 1.0
    assert others_cores(samples[:1]) is None and study_cores([]) is None
    # a study process reaped by someone else loses its time: never a negative share
    assert others_cores([samples[0], {"t_s": 1.0, "cpu_machine_busy_s": 100.5, "cpu_study_s": 12.0}]) == 0.0
