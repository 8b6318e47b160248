"""The outputs folder: atomic parts, a bad part moved aside (so its cell reruns), plan, profile, failures."""

import os

import pytest

from specstudy.costmodel import HardwareProfile
from specstudy.layout import BadPartError, StudyLayout
from specstudy.records import Cell, Request, Sampling


def _records(cell_id: str, n: int = 2):
    cell = Cell("s", "cpu", "reference", "ar", "code", "m", id=cell_id)
    return [
        cell.new_record(Request(f"p{i}", "x"), Sampling(max_new_tokens=3), output_tokens=3, end_s=0.1) for i in range(n)
    ]


def test_parts_are_atomic_and_temp_files_ignored(tmp_path):
    lay = StudyLayout(tmp_path)
    lay.write_part("a", _records("a"))
    (lay.records_dir / ".b.parquet.123.tmp").write_bytes(b"half-written")
    (lay.records_dir / ".c.parquet").write_bytes(b"half-written")
    assert [p.name for p in lay.part_paths()] == ["a.parquet"]
    assert list(lay.read_records()) == ["a"] and len(lay.read_all()) == 2
    assert not [p for p in os.listdir(lay.records_dir) if p.endswith(".tmp") and "a.parquet" in p]


def test_a_truncated_part_is_moved_aside_and_named(tmp_path):
    lay = StudyLayout(tmp_path)
    lay.write_part("a", _records("a"))
    lay.write_part("b", _records("b"))
    path = lay.part_path("b")
    path.write_bytes(path.read_bytes()[:40])  # a disk that filled
    with pytest.raises(BadPartError, match="b.parquet"):
        lay.read_records()
    assert lay.check_part("a") is None
    msg = lay.check_part("b")
    assert msg and str(path) in msg and "moved to" in msg
    assert not lay.is_done("b") and lay.is_done("a")
    assert list(lay.read_records()) == ["a"] and (lay.records_dir / "bad").is_dir()


def test_plan_profile_provenance_and_failures(tmp_path):
    lay = StudyLayout.of("cpu", tmp_path)
    assert lay.root == tmp_path / "cpu" and lay.read_plan() == {} and lay.load_profile() is None
    lay.write_plan({"study": "s", "cells": []})
    assert lay.read_plan()["study"] == "s"
    prof = HardwareProfile(
        name="cpu",
        device="host",
        memory_bandwidth_gbps=12.5,
        peak_tflops_by_dtype={"fp32": 0.2},
        memory_gb=16,
        kind="cpu",
        source="measured",
    )
    lay.save_profile(prof)
    assert lay.load_profile() == prof
    lay.append_provenance({"date": "1"})
    lay.append_provenance({"date": "2"})
    assert [r["date"] for r in lay.provenance_runs()] == ["1", "2"]
    lay.record_failure("x", {"cell_id": "x", "error": "boom"})
    assert [f["cell_id"] for f in lay.failed_cells()] == ["x"]
    lay.write_part("x", _records("x"))  # it ran since: no longer failed
    assert lay.failed_cells() == [] and not lay.failed_path("x").exists()


def test_one_runner_per_folder(tmp_path):
    lay = StudyLayout(tmp_path)
    with lay.lock():
        with pytest.raises(RuntimeError, match="another `specstudy run`"):
            with lay.lock():
                pass
