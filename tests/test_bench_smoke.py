"""Every bench/ script and every `make bench-*` target at its tiniest size, so a renamed metric, field or
flag breaks a test instead of the next benchmark run (`make bench-engine` once died on a removed key).

Structure only: the figures are measured and printed, and what is asserted is that they are there, named
as the printed table says, and consistent with each other, never how fast anything ran (the speed targets
live in the benchmarks themselves).  Where a script runs elsewhere in the suite, the registry below says
where: bench/gpu_check.py needs a GPU for its real shapes and runs its CPU path (--tiny) in
tests/test_gpu_check.py; bench/send_schedule.py runs against its stub server in
tests/run/test_send_schedule_bench.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import re
import shlex
import subprocess
import time
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
#: every bench script -> the test file that runs it at a tiny size
SMOKED = {
    "dryrun.py": "tests/test_bench_smoke.py",
    "drafter_al.py": "tests/test_bench_smoke.py",
    "engine.py": "tests/test_bench_smoke.py",
    "gpu_check.py": "tests/test_gpu_check.py",
    "llamacpp_costs.py": "tests/test_bench_smoke.py",
    "llamacpp_threads.py": "tests/test_bench_smoke.py",
    "overhead.py": "tests/test_bench_smoke.py",
    "planted_drift.py": "tests/test_bench_smoke.py",
    "server_sets.py": "tests/test_server_sets_bench.py",
    "profile_step.py": "tests/test_bench_smoke.py",
    "send_schedule.py": "tests/run/test_send_schedule_bench.py",
}
#: what a target needs on top of its own arguments to parse here: gpu_check's real shapes need CUDA (on a
#: CPU machine the target runs with BENCH_ARGS=--tiny, the path tests/test_gpu_check.py runs)
ON_A_CPU = {"bench-gpu-check": ["--tiny"]}


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name.removesuffix('.py')}", BENCH / name)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _make_targets() -> list[str]:
    return sorted(set(re.findall(r"^(bench-[\w-]+):", (ROOT / "Makefile").read_text(), re.M)))


def _make_command(target: str, bench_args: str = "") -> list[str]:
    """The command `make TARGET` runs (make -n: nothing runs, the venv stamp is not remade)."""
    out = subprocess.run(
        ["make", "-n", "-s", "-o", ".venv/.specstudy-installed", "BIN=/venv/bin", target, f"BENCH_ARGS={bench_args}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    ).stdout
    lines = [ln for ln in out.replace("\\\n", " ").splitlines() if "bench/" in ln]
    assert len(lines) == 1, out
    return shlex.split(lines[0])


# --------------------------------------------------------------------------------------------
# the registry and the make targets (no model, no server: fast)


def test_every_bench_script_has_a_make_target_and_a_smoke_run():
    scripts = {p.name for p in BENCH.glob("*.py")}
    assert scripts == set(SMOKED), "a bench script without a smoke run (add it here) or a stale entry"
    for name, test_file in SMOKED.items():
        assert name in (ROOT / test_file).read_text(), (name, test_file)
    targeted = {Path(_make_command(t)[1]).name for t in _make_targets()}
    assert targeted == scripts, f"bench scripts without a make target: {sorted(scripts - targeted)}"


@pytest.mark.parametrize("target", _make_targets())
def test_every_make_bench_target_names_a_script_whose_parser_takes_its_arguments(target):
    """The target's own argument list (bench-engine-pair's long one, bench-gpu-check's --out) parses, and
    BENCH_ARGS reaches the script; running each script is below (or in the file SMOKED names)."""
    argv = _make_command(target, "--json")
    assert argv[0] == "/venv/bin/python" and argv[1].startswith("bench/") and argv[-1] == "--json"
    assert (ROOT / argv[1]).is_file()
    import torch

    extra = ON_A_CPU.get(target, []) if not torch.cuda.is_available() else []
    args = _script(Path(argv[1]).name).parse_args(argv[2:-1] + extra)
    assert isinstance(args, argparse.Namespace)
    given = [a.lstrip("-").replace("-", "_") for a in argv[2:-1] if a.startswith("--")]
    assert all(hasattr(args, a) for a in given), (given, vars(args))


def test_make_lint_and_the_hook_type_check_the_benchmarks_with_the_package():
    lint = re.search(r"^lint:.*?(?=^\S)", (ROOT / "Makefile").read_text(), re.M | re.S)
    assert lint is not None and re.search(r"mypy specstudy bench\b", lint.group(0))
    assert re.search(r"entry: \.venv/bin/mypy specstudy bench$", (ROOT / ".pre-commit-config.yaml").read_text(), re.M)


# --------------------------------------------------------------------------------------------
# tiny runs: the dry-run benchmark (subprocesses, no model)


def test_dryrun_bench_reports_wall_and_validation_time_against_the_target(capsys):
    mod = _script("dryrun.py")
    assert mod.main(["--hardware", "cpu", "--repeats", "1", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["targets"] == {"wall_s": 5.0, "validated_in_s": 5.0} and res["repeats"] == 1
    (row,) = res["rows"]
    assert row["hardware"] == "cpu" and row["cells"] > 0
    for key in ("wall_s", "validated_in_s"):
        fig = row[key]
        assert 0 < fig["median"] <= fig["worst"] and fig["target"] == 5.0
        assert fig["median_over_target"] == pytest.approx(fig["median"] / 5.0)
        assert fig["met"] == {"median": fig["median"] < 5.0, "worst": fig["worst"] < 5.0}
    assert row["validated_in_s"]["median"] < row["wall_s"]["median"]  # the validation is part of the command
    mod.show(res)
    out = capsys.readouterr().out
    assert "wall s" in out and "valid. s" in out and re.search(r"^cpu\s+\d+\s", out, re.M)
    assert "wall_s < 5 s:" in out and "validated_in_s < 5 s:" in out
    with pytest.raises(SystemExit):
        mod.parse_args(["--hardware", "no-such-profile"])


# --------------------------------------------------------------------------------------------
# tiny runs that load the embedded SmolLM2 (slow)


@pytest.fixture
def keep_torch_threads():
    """The engine and overhead benches set torch's thread count: give the suite its own back."""
    import torch

    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.mark.slow
def test_drafter_al_bench_prints_each_row_and_checks_greedy_against_ar(tmp_path, capsys, keep_torch_threads):
    out = tmp_path / "al.json"
    rows = "eagle:2:params/drafters/smollm2-135m-eagle.safetensors:tree_nodes=3,tree_topk=2"
    argv = ["--tasks", "qa", "--prompts", "1", "--max-new-tokens", "4", "--rows", rows, "--json", str(out)]
    assert _script("drafter_al.py").main(argv) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["rows"].values()
    assert row["greedy_equals_ar"] is True and row["n_prompts"] == 1 and row["AL"] >= 1.0
    assert "load_before" in doc and "wall_s" in capsys.readouterr().out


@pytest.mark.slow
def test_engine_bench_prints_and_writes_every_figure_at_tiny_size(tmp_path, capsys, keep_torch_threads):
    out = tmp_path / "engine.json"
    # qa: the shortest packaged prompts (~50 tokens with the chat template; code's are ~200)
    argv = ["--methods", "ar,ngram", "--tasks", "qa", "--prompts", "1", "--max-new-tokens", "4", "--gamma", "2"]
    argv += ["--curve", "1", "--curve-repeats", "1", "--heads", "", "--eagle", "", "--json", str(out)]
    argv += ["--forward", "both"]  # the lean forward and transformers' side by side: rows "ar", "ar [tf]", ...
    assert _script("engine.py").main(argv) == 0
    printed = capsys.readouterr().out
    header = next(ln for ln in printed.splitlines() if ln.startswith("method"))
    for col in ("tok/s", "speedup", "dec.sp", "alpha", "a_hat", "AL", "pred", "meas/pred", "HF tok/s", "HF AL"):
        assert re.search(rf"(^|\s){re.escape(col)}(\s|$)", header), col
    assert re.search(r"^ar\s", printed, re.M) and re.search(r"^ngram\s", printed, re.M)
    assert "verification cost T(k)/T(1) (lean forward)" in printed
    assert "verification cost T(k)/T(1) (transformers forward)" in printed
    for limit in ("copy bandwidth:", "AR (lean):", "AR [tf]:", "matmul floor T_mm(k)/T_mm(1)", "over its matmul floor"):
        assert limit in printed, limit  # why a target is or is not met, in numbers
    doc = json.loads(out.read_text())
    assert set(doc) == {
        "results",
        "verify_ratio",
        "curve_s",
        "verify_ratio_transformers_forward",
        "limits",
        "cpu",
        "load_avg",
        "args",
    }
    assert set(doc["verify_ratio"]) == {"1", "3"} and doc["verify_ratio"]["1"] == 1.0  # k = 1 and γ + 1
    assert set(doc["verify_ratio_transformers_forward"]) == {"1", "3"}
    assert set(doc["limits"]["matmul_pass_s"]) == {"1", "3"} and doc["limits"]["copy_gbps_model_size"] > 0
    res = doc["results"]
    assert set(res) == {"ar", "ngram", "ar [tf]", "ngram [tf]"}
    assert res["ar"]["achieved_bandwidth_gbps"] > 0 and res["ar [tf]"]["speedup"] == 1.0
    for name, r in res.items():
        for key in ("tokens_per_s", "speedup", "decode_speedup", "alpha", "acceptance_length", "exact_match_vs_ar"):
            assert key in r, (name, key)
        for key in ("hf_tokens_per_s", "hf_acceptance_length", "ours_over_hf", "hf_same_tokens"):
            assert key in r, (name, key)  # HF's own implementation ran beside it
        assert r["tokens_per_s"] > 0 and 0 <= r["exact_match_vs_ar"] <= 1
    assert res["ar"]["speedup"] == 1.0 and math.isnan(res["ar"]["acceptance_length"])  # AR drafts nothing
    ng = res["ngram"]  # 4 tokens of a qa answer may draft nothing: then AL, α̂ and the prediction are NaN
    assert ng["gamma"] == 2 and (math.isnan(ng["acceptance_length"]) or 1 <= ng["acceptance_length"] <= 3)
    assert ng["c"] >= 0 and ng["verify_ratio"] == doc["verify_ratio"]["3"]  # T(γ+1)/T(1) from the curve
    for key in ("predicted", "measured_over_predicted"):  # a static-γ row: the cost model's prediction beside it
        assert key in ng, key
    assert ng["ours_over_hf"] == pytest.approx(ng["tokens_per_s"] / ng["hf_tokens_per_s"])


@pytest.mark.slow
def test_engine_bench_sets_eagle3_and_mtp_verification_beside_ar_curve(tmp_path, capsys, keep_torch_threads):
    out = tmp_path / "engine.json"
    argv = ["--methods", "ar,eagle3,mtp", "--tasks", "qa", "--prompts", "1", "--max-new-tokens", "6", "--gamma", "2"]
    argv += ["--curve", "1", "--curve-repeats", "1", "--skip-hf", "--clock", "cpu", "--json", str(out)]
    assert _script("engine.py").main(argv) == 0
    printed = capsys.readouterr().out
    assert "verification cost per step, in units of the paired AR step T1" in printed and "clock cpu" in printed
    res = json.loads(out.read_text())["results"]
    ratio = json.loads(out.read_text())["verify_ratio"]["3"]
    assert set(res) == {"ar", "eagle3", "mtp"}  # the committed head and layer are found by their folders
    for name in ("eagle3", "mtp"):
        r = res[name]
        assert re.search(rf"^{name}\s+2\s", printed, re.M), name
        assert r["step_c"] > 0 and r["step_verify_ratio"] > 0  # both drafters run a module per draft
        assert r["verify_over_curve"] == pytest.approx(r["step_verify_ratio"] / ratio)
        assert r["exact_match_vs_ar"] == 1.0  # greedy: the same tokens as AR


def test_engine_bench_refuses_the_cpu_clock_where_one_thread_is_not_the_whole_step(capsys):
    mod = _script("engine.py")
    with pytest.raises(SystemExit):
        mod.parse_args(["--clock", "cpu", "--threads", "2"])  # and HF's rows, timed on the wall
    err = capsys.readouterr().err
    assert "--threads 1 (got 2)" in err and "--skip-hf (got False)" in err  # both problems at once
    assert mod.parse_args(["--clock", "cpu", "--skip-hf"]).clock == "cpu"


@pytest.mark.slow
def test_overhead_bench_reports_each_piece_against_a_decode_step(capsys, keep_torch_threads):
    mod = _script("overhead.py")
    argv = ["--steps", "2", "--timer-repeats", "5", "--emit-repeats", "2", "--record-repeats", "1", "--json"]
    assert mod.main(argv) == 0
    res = json.loads(capsys.readouterr().out)
    pieces = (
        "timer (enter + exit)",
        "BatchTrace.emit (StepRecord, log p, entropy)",
        "records + parquet, amortised per step",
    )
    step, total = "decode step (1-token forward, KV cache)", "instrumentation total per step"
    assert set(res["median_s"]) == {step, total, *pieces} and all(v > 0 for v in res["median_s"].values())
    assert res["median_s"][total] == pytest.approx(sum(res["median_s"][p] for p in pieces))
    share = res["share_of_decode_step"]
    assert share[step] == 1.0 and share[total] == pytest.approx(res["median_s"][total] / res["median_s"][step])
    assert res["goal"] == 0.01 and res["meets_goal"] is (share[total] <= 0.01)
    mod.show(res)
    out = capsys.readouterr().out
    assert "/ decode step" in out and all(p in out for p in pieces) and "instrumentation / decode step =" in out


def test_planted_drift_bench_prints_each_order_and_row_at_tiny_size(capsys, keep_torch_threads):
    """Structure only (no burner here): both orders, the A/A and prompt-lookup rows, their pairing gaps."""
    mod = _script("planted_drift.py")
    assert mod.main(["--tiny", "--prompts", "3", "--max-new-tokens", "4", "--burners", "0", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    got = [(r["order"], r["row"]) for r in res["rows"]]
    assert got == [(o, row) for o in ("cell after cell", "in time") for row in ("A/A control", "Prompt lookup")]
    for r in res["rows"]:
        assert r["n_prompts"] == 3 and r["speedup"] > 0 and r["arms_apart_median_s"] >= 0
        assert (r["aa_includes_1x"] is None) == (r["row"] != "A/A control")
    apart = {r["order"]: r["arms_apart_median_s"] for r in res["rows"] if r["row"] == "A/A control"}
    assert apart["in time"] < apart["cell after cell"]  # in time, a pair's arms are a request apart
    mod.show(res)
    assert "| in time | A/A control |" in capsys.readouterr().out


@pytest.mark.slow
def test_llamacpp_costs_bench_prints_the_curve_and_c_at_tiny_size(tmp_path, capsys):
    mod = _script("llamacpp_costs.py")
    argv = ["--kmax", "2", "--repeats", "1", "--decode-tokens", "4", "--step-tokens", "8"]
    assert mod.main([*argv, "--log-dir", str(tmp_path), "--json"]) == 0
    (res,) = json.loads(capsys.readouterr().out)
    assert res["model"] == "smollm2-135m" and res["drafter"] is None and res["c"] is None  # n-gram: no draft model
    assert res["ks"] == [1, 2] and set(res["verify_ms"]) == {"1", "2"} and res["verify_ratio"]["1"] == 1.0
    assert all(v > 0 for v in res["verify_ms"].values()) and res["target_ms_per_token"] > 0
    assert set(res["step_ms"]) <= {"1", "2"} and set(res["step_counts"]) == set(res["step_ms"])
    assert res["load_average"]["before"] and res["load_average"]["after"] and res["caveat"]
    assert list(tmp_path.glob("llamacpp_*.log"))  # the servers' logs went where --log-dir said
    # show() reads the dict measure_costs returns (int keys); the JSON above has them as strings
    for key in ("verify_ms", "verify_ratio", "step_ms", "step_ratio", "step_counts"):
        res[key] = {int(k): v for k, v in res[key].items()}
    mod.show(res)
    out = capsys.readouterr().out
    assert "T(k)/T(1)" in out and "target decode" in out and "c: no draft model" in out
    assert re.search(r"^\s+1\s+[\d.]+\s+1\.000", out, re.M)
    with pytest.raises(SystemExit):
        mod.parse_args(["--kmax", "1"])  # the n-gram run needs one draft


@pytest.mark.slow
def test_llamacpp_threads_bench_compares_side_by_side_and_withholds_a_verdict_when_busy(tmp_path, capsys, monkeypatch):
    mod = _script("llamacpp_threads.py")
    argv = ["--prompts", "2", "--tokens", "4", "--rounds", "2", "--log-dir", str(tmp_path)]
    assert mod.main([*argv, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    for key, (a, b) in {"threads": ("threads 1", "threads 2"), "telemetry": ("telemetry off", "telemetry on")}.items():
        s = res[key]
        assert (s["a"], s["b"], s["n_prompts"]) == (a, b, 2) and s["tpot_ms_a"] > 0 and s["tpot_ms_b"] > 0
    monkeypatch.setattr(mod, "busy_reasons", lambda *a, **k: ["load 9.00 on 2 cores (above 2.5 while the cell ran)"])
    assert mod.main(argv) == 0
    assert "no verdict: the machine was busy (load 9.00" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        mod.parse_args(["--rounds", "0"])


def test_profile_step_prints_op_shares_the_curve_and_the_matmul_rates(capsys, keep_torch_threads):
    """bench/profile_step.py at its tiniest: every k gets an op table, T(k)/T(1) and the matmul rows."""
    assert (
        _script("profile_step.py").main(["--tiny", "--ks", "1,2", "--repeats", "1", "--top", "3", "--ar-tokens", "4"])
        == 0
    )
    out = capsys.readouterr().out
    assert "== k=1:" in out and "== k=2:" in out and out.count("self-CPU share") == 2  # the tiny top-3 varies
    assert re.search(r"T\(k\)/T\(1\): 1: 1\.00, 2: \d+\.\d\d", out)
    assert re.search(r"^lm_head\s+2\s+[\d.]+\s+[\d.]+\s+[\d.]+\s+[\d.]+$", out, re.M)
    # one AR token split into the matmuls, the rest of the forward and the engine's work outside it
    m = re.search(r"AR token ([\d.]+) ms .*matmuls alone ([\d.]+) ms", out)
    assert m and float(m.group(1)) > 0 and float(m.group(2)) > 0
    assert re.search(r"forward -?[\d.]+ ms \(-?\d+%\), outside the forward -?[\d.]+ ms", out)


def test_the_ar_breakdown_is_per_token_not_a_sum_of_timestamps(keep_torch_threads):
    """A step's ``t_s`` is its end since the request began: summed, it grows with the square of the
    tokens.  Three decodes of n tokens each hold n - 1 decode steps, so 3 (n - 1) x the per-token time
    can never exceed the call's own wall time (the summed timestamps read ~(n - 1) / 2 times it)."""
    from specstudy.data.model_files import tiny_model

    bench = _script("profile_step.py")
    model = tiny_model(seed=0, dtype="float32", vocab_size=512, num_layers=2)
    n = 24
    t0 = time.perf_counter()
    b = bench.ar_breakdown(model, list(range(3, 19)), n, repeats=2, packed=False)
    wall_ms = (time.perf_counter() - t0) * 1e3
    assert 0 < b["matmul_ms"] and 0 < b["forward_ms"]
    assert 3 * (n - 1) * b["ar_token_ms"] <= wall_ms, (b, wall_ms)
