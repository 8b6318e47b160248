"""Live (``make test-engines``): the kit's MTP layer for SmolLM2 in vLLM CPU's offline worker (SmolLM2 and
the layer written as one MiMo model, ``method: mtp``) and in the reference engine, from the same folder.

Greedy: speculation changes no token; the layer drafts and some drafts are accepted; the two engines
accept the same tokens prompt by prompt within the output (the cross-engine comparison's own verdict).
"""

from __future__ import annotations

import os

import pytest

from specstudy.records import Cell, Request, Sampling

from .test_vllm_eagle3_live import check_lossless, vllm_backend
from .test_vllm_worker_live import CPU_ENV, PROMPT, model_dir, vllm_python  # noqa: F401  # fixtures

pytestmark = pytest.mark.engines

LAYER = os.environ.get("SPECSTUDY_MTP_LAYER", "params/drafters/smollm2-135m-mtp")
REQS = [Request("c0", PROMPT), Request("c1", "def fibonacci(n):\n    ")]
GREEDY = Sampling(max_new_tokens=24)


def cell(framework: str, method: str, gamma: int | None = None) -> Cell:
    return Cell("t", "cpu", framework, method, "code", "smollm2-135m", drafter=LAYER if gamma else None, gamma=gamma)


def test_vllm_and_the_reference_engine_accept_the_same_mtp_drafts(vllm_python, model_dir, tmp_path):  # noqa: F811
    from specstudy.backends import get_backend
    from specstudy.report.across_engines import AT_END, IDENTICAL, paired_verdict

    env = {**CPU_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    b = vllm_backend("vllm", vllm_python, model_dir, tmp_path, env, startup_timeout_s=900, run_timeout_s=900)
    try:
        v_ar = list(b.run(REQS, GREEDY, cell("vllm", "ar")))
        v_mtp = list(b.run(REQS, GREEDY, cell("vllm", "mtp", 4)))
    finally:
        b.close()
    ref = get_backend("reference", model="smollm2-135m")
    r_ar = list(ref.run(REQS, GREEDY, cell("reference", "ar")))
    r_mtp = list(ref.run(REQS, GREEDY, cell("reference", "mtp", 4)))
    print("vllm", check_lossless(v_ar, v_mtp), "reference", check_lossless(r_ar, r_mtp))
    said = paired_verdict({"reference": r_mtp, "vllm": v_mtp}, 4)
    assert said == IDENTICAL or said.startswith(AT_END), said
