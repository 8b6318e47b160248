"""Live (``make test-engines``): the kit's DFlash drafter for SmolLM2 in vLLM CPU's offline worker
(``method: dflash``, the folder as speculative_config.model, SmolLM2 as it is) and in the reference
engine, from the same folder.

Greedy: speculation changes no token; the drafter drafts blocks and some drafts are accepted; the two
engines accept the same tokens prompt by prompt within the output (the cross-engine comparison's own
verdict).
"""

from __future__ import annotations

import os

import pytest

from specstudy.records import Cell, Request, Sampling

from .test_vllm_eagle3_live import check_lossless, vllm_backend
from .test_vllm_worker_live import CPU_ENV, PROMPT, model_dir, vllm_python  # noqa: F401  # fixtures

pytestmark = pytest.mark.engines

DRAFTER = os.environ.get("SPECSTUDY_DFLASH_DRAFTER", "params/drafters/smollm2-135m-dflash")
REQS = [Request("c0", PROMPT), Request("c1", "def fibonacci(n):\n    ")]
GREEDY = Sampling(max_new_tokens=24)


def cell(framework: str, method: str, gamma: int | None = None) -> Cell:
    return Cell("t", "cpu", framework, method, "code", "smollm2-135m", drafter=DRAFTER if gamma else None, gamma=gamma)


def test_vllm_and_the_reference_engine_accept_the_same_dflash_drafts(vllm_python, model_dir, tmp_path):  # noqa: F811
    from specstudy.backends import get_backend
    from specstudy.report.across_engines import AT_END, IDENTICAL, paired_verdict

    env = {**CPU_ENV, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    b = vllm_backend("vllm", vllm_python, model_dir, tmp_path, env, startup_timeout_s=900, run_timeout_s=900)
    try:
        v_ar = list(b.run(REQS, GREEDY, cell("vllm", "ar")))
        v_dflash = list(b.run(REQS, GREEDY, cell("vllm", "dflash", 4)))
    finally:
        b.close()
    ref = get_backend("reference", model="smollm2-135m")
    r_ar = list(ref.run(REQS, GREEDY, cell("reference", "ar")))
    r_dflash = list(ref.run(REQS, GREEDY, cell("reference", "dflash", 4)))
    print("vllm", check_lossless(v_ar, v_dflash), "reference", check_lossless(r_ar, r_dflash))
    said = paired_verdict({"reference": r_dflash, "vllm": v_dflash}, 4)
    assert said == IDENTICAL or said.startswith(AT_END), said
