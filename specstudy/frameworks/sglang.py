"""SGLang 0.5.23's declaration: ``--speculative-algorithm`` builtins EAGLE, EAGLE3, NEXTN,
STANDALONE, NGRAM, DFLASH, DSPARK, UNO (``sglang/srt/arg_groups/fields/spec.py``); no Medusa.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..metrics import expected_acceptance_length
from .declaration import EngineDeclaration, EngineEnv, synthetic_rule

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


#: framework option (kit name) -> SGLang's server flag (None: read by the kit's client)
SGLANG_OPTIONS = {
    "dtype": "--dtype",
    "max_model_len": "--context-length",
    "tensor_parallel_size": "--tp-size",
    "gpu_memory_utilization": "--mem-fraction-static",
    "prefix_cache": "--disable-radix-cache",  # off (the kit's default) adds the flag
    "flush_cache": None,  # POST /flush_cache before every cell
}
#: the flags the server argv writes from the options above (dtype and the cache are written apart)
SGLANG_FLAGS = ("max_model_len", "tensor_parallel_size", "gpu_memory_utilization")

SGLANG_ENV = EngineEnv(
    name="sglang",
    engine="sglang",
    build="cuda",
    venv=".venv-sglang",
    packages=(f"sglang=={SGLANG_VERSION}",),
    requirements_file=f"sglang-{SGLANG_VERSION}.txt",
    notes=f"CUDA only: SGLang {SGLANG_VERSION} has no CPU build that installs from PyPI",
    disk_gb=15.0,
)

SGLANG = EngineDeclaration(
    framework="sglang",
    backend="sglang.server:SglangServerBackend",
    methods=("ar", *KIT_TO_SGLANG),
    method_options=SGLANG_METHOD_OPTIONS,
    engine_options=SGLANG_OPTIONS,
    method_families={"eagle": "heads", "eagle3": "heads"},
    needs_drafter=frozenset({"draft_target", "eagle", "eagle3"}),
    drafter_format="sglang",
    server=True,
    http=True,
    serve_bench=True,
    start_s=120.0,
    tensor_parallel=True,
    environments=(SGLANG_ENV,),
    requirement=("sglang", "its own pinned environment .venv-sglang: make engine-sglang"),
    provenance_packages=("sglang",),
)
DECLARATIONS = (SGLANG,)
