"""Live (``make test-engines``): the kit's EAGLE-3 head for SmolLM2 in vLLM CPU (offline worker and
OpenAI server) and in the reference engine, from the same folder (config.json + model.safetensors).

Greedy: speculation changes no token (each engine against its own AR); the head really drafts
and some drafts are accepted.  Acceptance is printed per engine for the report, never asserted
against a number.
"""

from __future__ import annotations

import json
import os

import pytest

from specstudy.records import Cell, Request, Sampling

from .test_vllm_worker_live import CPU_ENV, PROMPT, model_dir, vllm_python  # noqa: F401  # fixtures

pytestmark = pytest.mark.engines

HEAD = os.environ.get("SPECSTUDY_EAGLE3_HEAD", "params/drafters/smollm2-135m-eagle3")  # another head: set this
REQS = [Request("c0", PROMPT), Request("c1", "def fibonacci(n):\n    ")]
GREEDY = Sampling(max_new_tokens=24)


def cell(framework: str, method: str, gamma: int | None = None) -> Cell:
    return Cell("t", "cpu", framework, method, "code", "smollm2-135m", drafter=HEAD if gamma else None, gamma=gamma)


def acceptance(rows) -> dict:
    from specstudy.metrics import acceptance_length, acceptance_rate

    drafted = sum(r.drafted_tokens or 0 for r in rows)
    accepted = sum(r.accepted_tokens or 0 for r in rows)
    steps = sum(r.draft_steps or 0 for r in rows)
    return {
        "drafted": drafted,
        "accepted": accepted,
        "alpha": acceptance_rate(accepted, drafted),
        "AL": acceptance_length(accepted, steps),
    }


def check_lossless(ar, spec) -> dict:
    assert [r.status for r in ar + spec] == ["ok"] * (len(ar) + len(spec)), [r.error for r in ar + spec]
    assert [r.output_ids for r in spec] == [r.output_ids for r in ar]  # greedy: speculation changes no token
    acc = acceptance(spec)
    assert acc["drafted"] > 0 and acc["accepted"] > 0
    return acc


def vllm_backend(framework: str, python: str, model: str, log_dir, env: dict, **timeouts):
    """The kit's vLLM backend on SmolLM2 in fp32, eager, prefix cache off (both vLLM frameworks)."""
    from specstudy.backends import get_backend

    return get_backend(
        framework,
        model=model,
        python=python,
        dtype="float32",
        max_model_len=1024,
        prefix_cache=False,
        enforce_eager=True,
        env=env,
        log_dir=log_dir,
        **timeouts,
    )


def offline_and_reference_verdict(method: str, drafter: str, python: str, model: str, log_dir) -> str:
    """``method`` with ``drafter`` (γ 4) and AR in vLLM's offline worker and in the reference engine, each
    lossless; the cross-engine comparison's own verdict on the two engines' accepted tokens."""
    from specstudy.backends import get_backend
    from specstudy.report.across_engines import paired_verdict

    def at(framework: str, gamma: int | None = None) -> Cell:
        m, d = (method, drafter) if gamma else ("ar", None)
        return Cell("t", "cpu", framework, m, "code", "smollm2-135m", drafter=d, gamma=gamma)

    env = {**CPU_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    b = vllm_backend("vllm", python, model, log_dir, env, startup_timeout_s=900, run_timeout_s=900)
    try:
        v_ar, v_spec = list(b.run(REQS, GREEDY, at("vllm"))), list(b.run(REQS, GREEDY, at("vllm", 4)))
    finally:
        b.close()
    ref = get_backend("reference", model="smollm2-135m")
    r_ar, r_spec = list(ref.run(REQS, GREEDY, at("reference"))), list(ref.run(REQS, GREEDY, at("reference", 4)))
    print("vllm", check_lossless(v_ar, v_spec), "reference", check_lossless(r_ar, r_spec))
    return paired_verdict({"reference": r_spec, "vllm": v_spec}, 4)


@pytest.fixture(scope="module")
def vllm_ar(vllm_python, model_dir, tmp_path_factory):  # noqa: F811
    env = {**CPU_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    log_dir = tmp_path_factory.mktemp("vllm")
    b = vllm_backend("vllm", vllm_python, model_dir, log_dir, env, startup_timeout_s=900, run_timeout_s=900)
    try:
        ar = list(b.run(REQS, GREEDY, cell("vllm", "ar")))
        spec = list(b.run(REQS, GREEDY, cell("vllm", "eagle3", 4)))
    finally:
        b.close()
    return ar, spec


def test_vllm_offline_runs_the_kits_eagle3_head_losslessly(vllm_ar):
    ar, spec = vllm_ar
    print("vllm offline eagle3 acceptance", json.dumps(check_lossless(ar, spec)))
    assert all(len(r.drafts_per_position or []) <= 4 for r in spec)


def test_vllm_server_runs_the_same_head_losslessly(vllm_python, model_dir, vllm_ar, tmp_path):  # noqa: F811
    b = vllm_backend("vllm-server", vllm_python, model_dir, tmp_path, CPU_ENV, ready_timeout_s=1800)
    try:
        spec = list(b.run(REQS, GREEDY, cell("vllm-server", "eagle3", 4)))
    finally:
        b.close()
    print("vllm server eagle3 acceptance", json.dumps(check_lossless(vllm_ar[0], spec)))


def test_the_reference_engine_runs_the_same_files_losslessly():
    from specstudy.backends import get_backend

    b = get_backend("reference", model="smollm2-135m")
    ar = list(b.run(REQS, GREEDY, cell("reference", "ar")))
    spec = list(b.run(REQS, GREEDY, cell("reference", "eagle3", 4)))
    print("reference eagle3 acceptance", json.dumps(check_lossless(ar, spec)))
