"""SGLang 0.5.23's declaration: ``--speculative-algorithm`` builtins EAGLE, EAGLE3, NEXTN,
STANDALONE, NGRAM, DFLASH, DSPARK, UNO (``sglang/srt/arg_groups/fields/spec.py``); no Medusa.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...metrics import expected_acceptance_length
from ..declaration import EngineDeclaration, synthetic_rule

SGLANG_VERSION = "0.5.23"
#: kit method -> SGLang --speculative-algorithm (0.5.23)
KIT_TO_SGLANG = {"eagle": "EAGLE", "eagle3": "EAGLE3", "ngram": "NGRAM", "draft_target": "STANDALONE"}
#: the cell options the SGLang backend reads, per method ("*": every speculative method)
SGLANG_METHOD_OPTIONS = {
    "*": ("synthetic_acceptance",),
    "ngram": ("ngram_breadth", "ngram_max_trie_depth"),
    "eagle": ("topk", "num_draft_tokens"),
    "eagle3": ("topk", "num_draft_tokens"),
    "draft_target": ("topk", "num_draft_tokens"),
}

#: SGLang: the environment variable ``SGLANG_SIMULATE_ACC_LEN`` (an acceptance length, bonus token
#: included); fixed acceptance rates are given to it as their expected AL (1 − a^(γ+1)) / (1 − a).
SGLANG_SIMULATE_ENV = "SGLANG_SIMULATE_ACC_LEN"


def sglang_synthetic_env(options: Mapping[str, Any], gamma: int | None) -> dict[str, str]:
    """The server environment of a synthetic SGLang cell ({} without one)."""
    rule = synthetic_rule(options, gamma)
    if rule is None:
        return {}
    if rule.mode == "length":
        length = float(rule.value)
    else:
        length = float(expected_acceptance_length(float(rule.value), int(gamma or 0)))
    return {SGLANG_SIMULATE_ENV: f"{length:.6g}"}


SGLANG = EngineDeclaration(
    framework="sglang",
    backend="sglang.server:SglangServerBackend",
    methods=("ar", *KIT_TO_SGLANG),
    method_options=SGLANG_METHOD_OPTIONS,
    needs_drafter=frozenset({"draft_target", "eagle", "eagle3"}),
    server=True,
    tensor_parallel=True,
    environment="sglang",
    requirement=("sglang", "its own pinned environment .venv-sglang: make engine-sglang"),
)
