"""TensorRT-LLM's version is read at preflight and the rows it cannot run refused (``--backend
tensorrt`` is removed after 1.2); N10: no AR baseline is planned where it pairs with nothing, and a
trtllm-engine start (a TensorRT engine build) is priced as one."""

import os
import stat
from pathlib import Path

from specstudy.config import load_study
from specstudy.environments.preflight import Probes, binary_package_version
from specstudy.frameworks import DECLARATIONS
from specstudy.frameworks.declaration import version_allowed
from specstudy.run.environment import keep_rows, prepare_machine
from specstudy.run.plan import check_backends, expand


def _probes(version):
    return Probes(
        gpus=lambda: ["NVIDIA H100 80GB HBM3"] * 4,
        installed=lambda env: True,
        imports=lambda py, mod: (True, ""),
        cached=lambda repo: "/hf/config.json",
        token=lambda: True,
        disk_free=lambda p: 10**15,
        which=lambda exe: "/usr/bin/" + exe,
        hf_home=lambda: Path("/hf"),
        node_memory=lambda: None,
        binary_version=lambda exe, pkg: version,
    )


def test_version_bounds_by_major_minor():
    assert version_allowed("1.2.0rc3", (None, "1.3")) and version_allowed("1.2.1", (None, "1.3"))
    assert not version_allowed("1.3.0", (None, "1.3")) and not version_allowed("2.0", (None, "1.3"))
    assert version_allowed("0.9", None)


def test_a_tensorrt_llm_after_1_2_refuses_only_the_engine_build_rows():
    cfg = check_backends(load_study("h100", check_tokenizers=False), files=False)
    assert prepare_machine(cfg, probes=_probes("1.2.0"), log=lambda m: None) == []
    notes = prepare_machine(cfg, probes=_probes("1.3.0rc1"), log=lambda m: None)
    assert [(n.kind, n.framework) for n in notes] == [("version", "trtllm-engine")]
    assert "tensorrt_llm 1.3.0rc1 is installed; trtllm-engine rows need any <= version < 1.3" in notes[0].why
    kept = keep_rows(expand(cfg), notes)
    assert kept and not [p for p in kept if p.cell.framework == "trtllm-engine"]
    assert [p for p in kept if p.cell.framework == "trtllm"]  # the PyTorch backend's rows still run
    # a version that cannot be read (no Python #! line) refuses nothing; provenance records it at start
    assert prepare_machine(cfg, probes=_probes(None), log=lambda m: None) == []


def test_the_version_is_read_from_the_executables_own_interpreter(tmp_path, monkeypatch):
    import sys

    exe = tmp_path / "fake-serve"
    exe.write_text(f"#!{sys.executable}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    import importlib.metadata

    assert binary_package_version("fake-serve", "pytest") == importlib.metadata.version("pytest")
    assert binary_package_version("fake-serve", "no-such-distribution") is None


def test_no_ar_baseline_pairs_with_nothing():
    for gpu in ("a100", "h100", "h200", "rtx4090"):
        plans = expand(load_study(gpu, check_tokenizers=False))
        spec = {(p.cell.framework, p.target) for p in plans if p.cell.method != "ar"}
        assert all((p.cell.framework, p.target) in spec for p in plans if p.cell.method == "ar"), gpu
        # the two 70B TensorRT engine builds that paired with nothing are gone
        assert not [p for p in plans if p.cell.framework == "trtllm-engine" and "70" in p.target], gpu


def test_a_trtllm_engine_start_is_priced_as_an_engine_build():
    assert DECLARATIONS["trtllm-engine"].start_s >= 1200 > DECLARATIONS["trtllm"].start_s
