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
KIT_TO_SGLANG = {
    "eagle": "EAGLE",
    "eagle3": "EAGLE3",
    "ngram": "NGRAM",
    "draft_target": "STANDALONE",
    # --speculative-dflash-block-size is the verify window, γ + 1 (sglang/srt/arg_groups/fields/spec.py and
    # speculative_hook.py of the 0.5.23 wheel: num_steps and topk forced to 1, the block its draft tokens)
    "dflash": "DFLASH",
    # the target's own MTP layer(s): NEXTN (an alias of EAGLE, speculative_hook.py) with the target's
    # checkpoint as the draft, which model_config.py loads as its MTP class (MiMoForCausalLM -> MiMoMTP)
    "mtp": "NEXTN",
}
#: the cell options the SGLang backend reads, per method ("*": every speculative method)
SGLANG_METHOD_OPTIONS = {
    "*": ("synthetic_acceptance",),
    "ngram": ("ngram_breadth", "ngram_max_trie_depth"),
    "eagle": ("topk", "num_draft_tokens", "adaptive_steps"),
    "eagle3": ("topk", "num_draft_tokens", "adaptive_steps"),
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
    cuda="13.0",  # its Requires-Dist: cuda-python>=13.0, nvidia-cutlass-dsl[cu13]
)

SGLANG = EngineDeclaration(
    framework="sglang",
    backend="sglang.sglang_server:SglangServerBackend",
    methods=("ar", *KIT_TO_SGLANG),
    method_options=SGLANG_METHOD_OPTIONS,
    engine_options=SGLANG_OPTIONS,
    method_families={"eagle": "heads", "eagle3": "heads", "dflash": "heads", "mtp": "heads"},
    needs_drafter=frozenset({"draft_target", "eagle", "eagle3", "dflash"}),
    block_drafting=frozenset({"dflash"}),
    schedule_options={"adaptive_steps": False},
    drafter_format="sglang",
    server=True,
    http=True,
    serve_bench=True,
    start_s=120.0,
    # eagle_worker_v2.py builds the draft worker with the target's context_length, and model_config.py
    # refuses a context longer than the draft's max_position_embeddings unless
    # SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set (which the kit never sets: the head was trained
    # to its own length); a study's max_model_len above a head's context is refused at validation
    draft_takes_target_context=True,
    tensor_parallel=True,
    # the native /generate's sampling_params (SamplingParams: json_schema is a str, ebnf an xgrammar
    # EBNF/GBNF grammar; one constraint per request); its EAGLE workers mask drafts with the grammar
    # (spec v1's generate_token_bitmask; spec v2 since sgl-project/sglang#13425)
    structured_output_fields={"json_schema": "sampling_params.json_schema", "grammar": "sampling_params.ebnf"},
    structured_output_as_text=frozenset({"json_schema"}),
    structured_with_speculation=True,
    structured_source="SGLang: grammar bitmasks on EAGLE drafts (spec v1; spec v2 since "
    "https://github.com/sgl-project/sglang/pull/13425); open report of EAGLE + structured outputs stuck: "
    "https://github.com/sgl-project/sglang/issues/9187",
    environments=(SGLANG_ENV,),
    requirement=("sglang", "its own pinned environment .venv-sglang: make engine-sglang"),
    provenance_packages=("sglang",),
)
DECLARATIONS = (SGLANG,)
