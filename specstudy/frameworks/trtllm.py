"""TensorRT-LLM 1.2's declarations (``trtllm-serve``), one per runtime backend, so every
speculative cell is paired with an AR baseline on its own backend.

From its ``tensorrt_llm/llmapi/llm_args.py``: ``decoding_type`` DraftTarget, NGram, Eagle (the
EAGLE config, EAGLE-3 heads on the PyTorch backend: ``EagleDecodingConfig`` with
``eagle3_one_model``; there is no ``Eagle3`` type), Medusa, MTP.  The PyTorch backend runs
DraftTarget, NGram and EAGLE-3; Medusa and EAGLE-1/2 checkpoints need the TensorRT engine
backend (``--backend tensorrt``), whose arguments class (``TrtLlmArgs``) forbids the PyTorch-only
keys (``enable_iter_perf_stats``, ``disable_overlap_scheduler``) and whose iteration statistics
carry no speculative counts: acceptance cannot be seen there.
"""

from __future__ import annotations

from typing import Any

from .declaration import Binary, EngineDeclaration

#: kit method -> TensorRT-LLM decoding_type, per runtime backend
PYTORCH_DECODING = {"draft_target": "DraftTarget", "ngram": "NGram", "eagle3": "Eagle"}
ENGINE_DECODING = {"eagle": "Eagle", "medusa": "Medusa"}
#: the cell options the TensorRT-LLM backends read, per method
TRTLLM_METHOD_OPTIONS = {"ngram": ("ngram_max",), "medusa": ("medusa_choices",), "eagle": ("eagle_choices",)}

TRTLLM_HINT = (
    "install TensorRT-LLM 1.2 (NVIDIA's container, or pip install tensorrt-llm on a CUDA machine) "
    "so that trtllm-serve is on PATH"
)
#: framework option (kit name) -> what the kit writes for trtllm-serve (a flag or an LLM API YAML key)
TRTLLM_OPTIONS = {
    "trtllm_serve": None,  # the executable (default trtllm-serve on PATH)
    "dtype": "dtype",
    "max_model_len": "--max_seq_len",
    "tensor_parallel_size": "--tp_size",
    "gpu_memory_utilization": "kv_cache_config.free_gpu_memory_fraction",
    "prefix_cache": "kv_cache_config.enable_block_reuse",
    "llm_api_options": "--extra_llm_api_options",
}

_COMMON: dict[str, Any] = dict(
    method_options=TRTLLM_METHOD_OPTIONS,
    engine_options=TRTLLM_OPTIONS,
    method_families={"eagle3": "heads", "eagle": "heads", "medusa": "heads"},
    server=True,
    http=True,
    tensor_parallel=True,
    # trtllm-serve is the user's own install: preflight looks for it on PATH
    binary=Binary(
        "trtllm-serve",
        "not on PATH (the kit does not install TensorRT-LLM)",
        TRTLLM_HINT,
        cuda_only=True,
    ),
    requirement=None,
    provenance_packages=("tensorrt_llm",),
)
TRTLLM = EngineDeclaration(
    framework="trtllm",
    structured_with_speculation=False,
    structured_source="TensorRT-LLM's documentation, as issue 35 cites it: guided decoding is not combined with "
    "speculative decoding (not re-checked against a release here)",
    backend="trtllm.server:TrtllmServerBackend",
    methods=("ar", *PYTORCH_DECODING),
    needs_drafter=frozenset({"draft_target", "eagle3"}),
    drafter_format="trtllm",
    start_s=180.0,
    **_COMMON,
)
TRTLLM_ENGINE = EngineDeclaration(
    framework="trtllm-engine",
    structured_with_speculation=False,
    structured_source="TensorRT-LLM's documentation, as issue 35 cites it: guided decoding is not combined with "
    "speculative decoding (not re-checked against a release here)",
    backend="trtllm.server:TrtllmEngineServerBackend",
    methods=("ar", *ENGINE_DECODING),
    needs_drafter=frozenset({"eagle", "medusa"}),
    start_s=60.0,
    **_COMMON,
)
DECLARATIONS = (TRTLLM, TRTLLM_ENGINE)
