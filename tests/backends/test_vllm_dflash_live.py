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

from .test_vllm_eagle3_live import offline_and_reference_verdict
from .test_vllm_worker_live import model_dir, vllm_python  # noqa: F401  # fixtures

pytestmark = pytest.mark.engines

DRAFTER = os.environ.get("SPECSTUDY_DFLASH_DRAFTER", "params/drafters/smollm2-135m-dflash")


def test_vllm_and_the_reference_engine_accept_the_same_dflash_drafts(vllm_python, model_dir, tmp_path):  # noqa: F811
    from specstudy.report.across_engines import AT_END, IDENTICAL

    said = offline_and_reference_verdict("dflash", DRAFTER, vllm_python, model_dir, tmp_path)
    assert said == IDENTICAL or said.startswith(AT_END), said
