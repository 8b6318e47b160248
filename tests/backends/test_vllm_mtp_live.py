"""Live (``make test-engines``): the kit's MTP layer for SmolLM2 in vLLM CPU's offline worker (SmolLM2 and
the layer written as one MiMo model, ``method: mtp``) and in the reference engine, from the same folder.

Greedy: speculation changes no token; the layer drafts and some drafts are accepted; the two engines
accept the same tokens prompt by prompt within the output (the cross-engine comparison's own verdict).
"""

from __future__ import annotations

import os

import pytest

from .test_vllm_eagle3_live import offline_and_reference_verdict
from .test_vllm_worker_live import model_dir, vllm_python  # noqa: F401  # fixtures

pytestmark = pytest.mark.engines

LAYER = os.environ.get("SPECSTUDY_MTP_LAYER", "params/drafters/smollm2-135m-mtp")


def test_vllm_and_the_reference_engine_accept_the_same_mtp_drafts(vllm_python, model_dir, tmp_path):  # noqa: F811
    from specstudy.report.across_engines import AT_END, IDENTICAL

    said = offline_and_reference_verdict("mtp", LAYER, vllm_python, model_dir, tmp_path)
    assert said == IDENTICAL or said.startswith(AT_END), said
