"""bench/gpu_check.py on the CPU with tiny shapes, with the kit's optional packages hidden (the
lent GPU machine has only torch, transformers, pandas, pyarrow, matplotlib, seaborn, psutil,
nvidia-ml-py, pyyaml, tqdm), and the cost model's calibration fit and reader."""

import importlib.util
import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from specstudy import costmodel, metrics
from specstudy.config import hardware_names, load_hardware_profile

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "gpu_check.py"
#: installed here for the kit (pyproject, optional engines) but absent on the lent machine
HIDDEN = [
    "papermill",
    "datasets",
    "pydantic",
    "gguf",
    "xllamacpp",
    "accelerate",
    "jupyterlab",
    "jupyter",
    "nbconvert",
    "nbformat",
    "nbclient",
    "ipykernel",
    "IPython",
    "hypothesis",
    "pytest",
    "_pytest",
    "vllm",
    "sglang",
    "openai",
    "scipy",
    "sklearn",
    "jinja2",
]
#: the only parts of the kit the script may import
ALLOWED = (
    "specstudy",
    "specstudy.engine",
    "specstudy.paths",
    "specstudy.drafter_names",
    "specstudy.costmodel",
    "specstudy.frameworks",  # the catalogue (ground floor): the method registry reads its method headers
    "specstudy.metrics",
    "specstudy.intervals",  # through metrics (numpy only; scipy imported where an interval is computed)
    "specstudy.records",
    "specstudy.telemetry",
    "specstudy.cpu_time",  # through telemetry (psutil only)
    "specstudy.synthetic",
)

RUNNER = r"""
import importlib.abc, importlib.util, json, runpy, sys

HIDDEN = set({hidden!r})


class Hide(importlib.abc.MetaPathFinder):
    '''Wraps a finder: hidden top-level packages are not found at all (find_spec is None), as
    on a machine where they are not installed.'''

    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HIDDEN:
            return None
        return self.inner.find_spec(name, path, target)

    def invalidate_caches(self):
        getattr(self.inner, "invalidate_caches", lambda: None)()

    def find_distributions(self, *args, **kwargs):  # importlib.metadata asks the finders too
        return getattr(self.inner, "find_distributions", lambda *a, **k: [])(*args, **kwargs)


for name in [m for m in sys.modules if m.partition(".")[0] in HIDDEN]:
    del sys.modules[name]
sys.meta_path[:] = [Hide(f) for f in sys.meta_path]
assert importlib.util.find_spec("papermill") is None and importlib.util.find_spec("pydantic") is None
try:
    import datasets  # noqa: F401
    raise SystemExit("the blocker let datasets through")
except ModuleNotFoundError:
    pass
sys.argv = ["gpu_check.py"] + {argv!r}
code = 0
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as e:
    code = e.code
json.dump(sorted(m for m in sys.modules if m.startswith("specstudy")), open({mods!r}, "w"))
sys.exit(code)
"""


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One --tiny run (a reduced grid: the same code paths) in a subprocess with the kit's
    optional packages hidden; returns the JSON, the specstudy modules it imported, its output."""
    d = tmp_path_factory.mktemp("gpu_check")
    out, mods = d / "calibration.json", d / "modules.json"
    argv = ["--tiny", "--gammas", "2,4", "--alphas", "0.8", "--batches", "1,8", "--budget-s", "3000", "--out", str(out)]
    code = RUNNER.format(hidden=HIDDEN, argv=argv, script=str(SCRIPT), mods=str(mods))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), json.loads(mods.read_text()), proc.stdout


def test_tiny_run_writes_every_key_and_finite_rows(tiny_run):
    data, _, stdout = tiny_run
    assert (data["schema"], data["version"]) == (costmodel.CALIBRATION_SCHEMA, costmodel.CALIBRATION_VERSION)
    for key in (
        "created",
        "device",
        "versions",
        "args",
        "profile",
        "shapes",
        "rows",
        "curve",
        "step_s",
        "draft_cost",
        "cells",
        "method_check",
        "microbench",
        "calibration",
        "telemetry_run",
        "wall_s",
    ):
        assert key in data, key
    assert data["errors"] == [] and data["skipped"] == []
    assert data["device"]["kind"] == "cpu" and data["versions"]["torch"] and data["versions"]["transformers"]
    sections = {r["section"] for r in data["rows"]}
    assert sections == {
        "microbench",
        "methods",
        "step",
        "verify",
        "draft_cost",
        "speedup",
        "memory",
        "hf",
        "calibration",
    }
    for r in data["rows"]:
        numbers = [v for v in r.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]
        assert math.isfinite(r["measured"]) and all(math.isfinite(v) for v in numbers), r
    assert set(data["curve"]) == {"1", "8"} and set(data["curve"]["1"]) >= {"1", "2", "3", "4", "5", "16", "32"}
    assert all(v > 0 for ks in data["curve"].values() for v in ks.values())
    assert set(data["draft_cost"]) == {"llama-68m", "tinyllama-1.1b"}
    assert "section" in stdout and "measured" in stdout and "wrote" in stdout  # the printed table


def test_tiny_run_measures_every_cell_it_promises(tiny_run):
    data, _, _ = tiny_run
    speedups = [r for r in data["rows"] if r["section"] == "speedup" and "synthetic" in r["name"]]
    assert {(r["name"].split()[0], r["gamma"], r["alpha"]) for r in speedups} == {
        (d, g, 0.8) for d in ("llama-68m", "tinyllama-1.1b") for g in (2, 4)
    }
    for r in speedups:
        assert r["al_expected"] == pytest.approx(metrics.expected_acceptance_length(0.8, r["gamma"]))
        assert 1.0 <= r["al_measured"] <= r["gamma"] + 1 and r["predicted_measured_costs"] > 0
        cell = data["cells"][r["cell"]]
        assert cell["peak_memory_bytes"] > 0 and "telemetry_samples" in cell["telemetry"]
    checks = data["method_check"]["cases"]
    assert {
        "ar",
        "ngram",
        "draft_target",
        "layer_skip",
        "heads",
        "heads_tree",
        "eagle",
        "tree",
        "draft_target+synthetic",
    } <= set(checks)
    assert all(c["equals_ar"] for name, c in checks.items() if "synthetic" not in name)  # lossless greedy
    assert checks["draft_target+synthetic"]["equals_ar"] is None  # not claimed lossless


def test_tiny_run_imports_only_the_allowed_parts_of_the_kit(tiny_run):
    _, modules, _ = tiny_run
    outside = [m for m in modules if not any(m == a or m.startswith(a + ".") for a in ALLOWED[1:]) and m != "specstudy"]
    assert outside == []


def test_a_tiny_calibration_is_read_but_never_applied(tiny_run, tmp_path):
    data, _, _ = tiny_run
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    cal = costmodel.load_calibration(str(path))
    assert cal["profile"] == "h200" and cal["usable"] is False and "tiny" in cal["why_not"]
    for key in ("bandwidth_efficiency", "compute_efficiency", "step_overhead_ms", "fit", "hardware", "date"):
        assert key in cal
    with pytest.raises(ValueError, match="not usable"):
        costmodel.calibrated_profile(load_hardware_profile("h200", measure=False), cal)


# --------------------------------------------------------------------------------------------
# the fit and the reader (pure)


def _measured(hw, params_list, batches=(1, 8, 32), tokens=(1, 2, 4, 8, 16, 32, 64)):
    return [
        costmodel.MeasuredStep(p, "bf16", b, k, costmodel.step_time(p, hw, "bf16", b, k))
        for p in params_list
        for b in batches
        for k in tokens
    ]


def test_fit_roofline_recovers_known_efficiencies_and_overhead():
    datasheet = load_hardware_profile("h200", measure=False)
    truth = replace(datasheet, bandwidth_efficiency=0.8, compute_efficiency=0.45, step_overhead_ms=0.9)
    fit = costmodel.fit_roofline(_measured(truth, [6.7e9, 1.1e9, 68e6]), replace(datasheet, bandwidth_efficiency=0.5))
    assert fit["bandwidth_efficiency"] == pytest.approx(0.8, rel=0.02)
    assert fit["compute_efficiency"] == pytest.approx(0.45, rel=0.02)
    assert fit["step_overhead_ms"] == pytest.approx(0.9, rel=0.05)
    assert fit["max_rel_error"] < 0.02 and fit["identified"] == {"bandwidth": True, "compute": True}
    assert fit["compute_bound_points"] > 0 and fit["memory_bound_points"] > 0


def test_fit_roofline_says_what_the_points_cannot_identify():
    hw = load_hardware_profile("h200", measure=False)
    one_size = costmodel.fit_roofline(_measured(hw, [6.7e9], batches=(1,), tokens=(1, 2, 3)), hw)
    assert one_size["identified"] == {"bandwidth": False, "compute": False}
    with pytest.raises(ValueError, match=">= 3 measured steps"):
        costmodel.fit_roofline(_measured(hw, [6.7e9], batches=(1,), tokens=(1,)), hw)
    with pytest.raises(ValueError, match="seconds > 0"):
        costmodel.fit_roofline([costmodel.MeasuredStep(1e9, "bf16", 1, 1, 0.0)] * 3, hw)


def test_calibration_reader_checks_schema_and_applies_only_to_its_profile(tmp_path):
    hw = load_hardware_profile("h200", measure=False)
    cal = {
        "profile": "h200",
        "usable": True,
        "date": "2026-01-02",
        "bandwidth_efficiency": 0.81,
        "compute_efficiency": 0.55,
        "step_overhead_ms": 4.2,
    }
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"schema": costmodel.CALIBRATION_SCHEMA, "version": 1, "calibration": cal}))
    got = costmodel.calibrated_profile(hw, costmodel.load_calibration(str(path)))
    assert (got.bandwidth_efficiency, got.compute_efficiency, got.step_overhead_ms) == (0.81, 0.55, 4.2)
    assert got.source == "measured 2026-01-02" and got.memory_bandwidth_gbps == hw.memory_bandwidth_gbps
    with pytest.raises(ValueError, match="applied to 'a100'"):
        costmodel.calibrated_profile(load_hardware_profile("a100", measure=False), cal)
    with pytest.raises(ValueError, match="compute_efficiency=1.5"):
        costmodel.calibrated_profile(hw, {**cal, "compute_efficiency": 1.5})
    path.write_text(json.dumps({"schema": "other", "version": 1}))
    with pytest.raises(ValueError, match="schema/version"):
        costmodel.load_calibration(str(path))
    with pytest.raises(ValueError, match="does not exist"):
        costmodel.load_calibration(str(tmp_path / "missing.json"))


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--shapes", "real", "--device", "cpu"], "--shapes real needs CUDA"),
        (["--tiny", "--alphas", "0.8,1.5"], r"--alphas='0.8,1.5': need comma-separated numbers in \[0.0, 1.0\]"),
        (["--tiny", "--gammas", "2.5"], r"--gammas='2.5': need comma-separated integers in \[1, 16\]"),
        (["--tiny", "--gammas", "0"], "--gammas='0'"),
        (["--tiny", "--max-new-tokens", "1"], "--max-new-tokens=1: need >= 2"),
        (["--tiny", "--budget-s", "0"], "--budget-s=0.0"),
    ],
)
def test_bad_arguments_are_refused_before_any_model_is_built(argv, message, tmp_path):
    with pytest.raises(SystemExit, match=message):
        _script().parse_args(argv + ["--out", str(tmp_path / "x.json")])
    assert not (tmp_path / "x.json").exists()


def test_the_scripts_profile_reader_matches_the_kits_loader():
    """The script reads profiles with yaml alone (no pydantic there); it must see the same figures."""
    spec = importlib.util.spec_from_file_location("gpu_check_script", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    for name in hardware_names():
        if name != "cpu":
            assert mod.datasheet_profile(name) == load_hardware_profile(name, measure=False), name
