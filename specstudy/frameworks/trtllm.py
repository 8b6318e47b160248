"""TensorRT-LLM 1.2's declarations (``trtllm-serve``), one per runtime backend, so every
speculative cell is paired with an AR baseline on its own backend.

From its ``tensorrt_llm/llmapi/llm_args.py``: ``decoding_type`` DraftTarget, NGram, Eagle, Medusa,
MTP.  On the PyTorch backend ``Eagle`` (``EagleDecodingConfig``) runs an EAGLE-3 head (its
``spec_dec_mode`` is EAGLE3, or EAGLE3_ONE_MODEL with ``eagle3_one_model``), which is what the kit
writes; the sources also declare ``Eagle3`` (``Eagle3DecodingConfig``, a subclass of it that only
renames the type), which the kit does not write.  The PyTorch backend runs
DraftTarget, NGram and EAGLE-3; Medusa and EAGLE-1/2 checkpoints need the TensorRT engine
backend (``--backend tensorrt``), whose arguments class (``TrtLlmArgs``) forbids the PyTorch-only
keys (``enable_iter_perf_stats``, ``disable_overlap_scheduler``) and whose iteration statistics
carry no speculative counts: acceptance cannot be seen there.
"""

from __future__ import annotations

from typing import Any

from .declaration import Binary, EngineDeclaration, gamma_per_batch

#: kit method -> TensorRT-LLM decoding_type, per runtime backend
PYTORCH_DECODING = {"draft_target": "DraftTarget", "ngram": "NGram", "eagle3": "Eagle"}
ENGINE_DECODING = {"eagle": "Eagle", "medusa": "Medusa"}
#: the cell options the TensorRT-LLM backends read, per method
TRTLLM_METHOD_OPTIONS = {
    "ngram": ("ngram_max", "gamma_per_batch"),
    "draft_target": ("gamma_per_batch",),
    "eagle3": ("gamma_per_batch",),
    "medusa": ("medusa_choices",),
    "eagle": ("eagle_choices",),
}
#: the engine's own γ schedule (``gamma_per_batch``, the kit's batch ranges) -> the speculative
#: config's ``draft_len_schedule`` {batch-size threshold: draft length}, which must start at
#: {1: max_draft_len} (``DecodingBaseConfig`` in ``tensorrt_llm/llmapi/llm_args.py``, read on the main
#: branch at 0004396; that 1.2 accepts it for each of these decoding types is not confirmed here)
TRTLLM_GAMMA_SCHEDULE_FIELD = "draft_len_schedule"


def trtllm_draft_len_schedule(text: str, gamma: int) -> dict[int, int]:
    """``"1-4:4,5-16:3"`` as TensorRT-LLM's {1: 4, 5: 3}: thresholds, so the ranges must be contiguous
    from batch 1, and batch 1 drafts the cell's γ (the engine refuses another)."""
    entries = gamma_per_batch(text, gamma)
    starts = [lo for lo, _, _ in entries]
    contiguous = all(lo == prev_hi + 1 for (lo, _, _), (_, prev_hi, _) in zip(entries[1:], entries))
    if starts[0] != 1 or not contiguous or entries[0][2] != gamma:
        raise ValueError(
            f"gamma_per_batch={text!r} for TensorRT-LLM: allowed contiguous ranges from batch 1 whose first γ is "
            f"the cell's γ {gamma} (draft_len_schedule is thresholds and must hold {{1: max_draft_len}})"
        )
    return {lo: k for lo, _, k in entries}


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
    # xgrammar or llguidance: the server's guided decoder, needed before a request may carry a constraint
    "guided_decoding_backend": "guided_decoding_backend",
}
#: the guided decoders trtllm-serve's guided_decoding_backend takes
GUIDED_BACKENDS = ("xgrammar", "llguidance")
#: trtllm-serve's completions ``response_format`` (openai_protocol.ResponseFormat: type "json" with
#: ``schema``, type "ebnf" with ``ebnf``), turned into GuidedDecodingParams by the server
TRTLLM_STRUCTURED: dict[str, Any] = dict(
    structured_output_fields={"json_schema": "response_format.schema", "grammar": "response_format.ebnf"},
    structured_output_tags={
        "json_schema": {"response_format.type": "json"},
        "grammar": {"response_format.type": "ebnf"},
    },
    structured_needs_option="guided_decoding_backend",
    structured_option_values=GUIDED_BACKENDS,
)

_COMMON: dict[str, Any] = dict(
    method_options=TRTLLM_METHOD_OPTIONS,
    schedule_options={"gamma_per_batch": None},
    engine_options=TRTLLM_OPTIONS,
    method_families={"eagle3": "heads", "eagle": "heads", "medusa": "heads"},
    method_seed_rows={"medusa": "Medusa-2"},
    server=True,
    http=True,
    tensor_parallel=True,
    **TRTLLM_STRUCTURED,
    # trtllm-serve is the user's own install: preflight looks for it on PATH
    binary=Binary(
        "trtllm-serve",
        "not on PATH (the kit does not install TensorRT-LLM)",
        TRTLLM_HINT,
        cuda_only=True,
        package="tensorrt_llm",
    ),
    requirement=None,
    provenance_packages=("tensorrt_llm",),
)
TRTLLM = EngineDeclaration(
    framework="trtllm",
    argv_unchecked_why="not tried: tensorrt_llm's LLM API args live in the tensorrt_llm package, published only as "
    "CUDA wheels of several GB that load the TensorRT and CUDA libraries at import",
    # Re-checked (2026-12): the "not combined" of issue 35 was TensorRT-LLM 1.0's PyTorch executor
    # (https://github.com/NVIDIA/TensorRT-LLM/issues/7006, closed); 1.3's guided decoder applies the
    # grammar to linear EAGLE-3 drafts, and a bug is open for dynamic trees only
    # (https://github.com/NVIDIA/TensorRT-LLM/issues/18892).  The kit sends trtllm no constraint yet.
    structured_with_speculation=True,
    structured_source="TensorRT-LLM 1.3 PyTorch backend: guided decoding with linear speculation "
    "(https://github.com/NVIDIA/TensorRT-LLM/issues/18892; refused up to 1.0, "
    "https://github.com/NVIDIA/TensorRT-LLM/issues/7006); dynamic trees may leave the grammar",
    backend="trtllm.trtllm_server:TrtllmServerBackend",
    methods=("ar", *PYTORCH_DECODING),
    needs_drafter=frozenset({"draft_target", "eagle3"}),
    drafter_format="trtllm",
    start_s=180.0,
    **_COMMON,
)
TRTLLM_ENGINE = EngineDeclaration(
    framework="trtllm-engine",
    argv_unchecked_why="not tried: as trtllm (the same tensorrt_llm package)",
    # the TensorRT engine backend's Medusa/EAGLE-1 with guided decoding: no document found either way
    structured_with_speculation=None,
    structured_source="TensorRT-LLM's engine backend: no document found on guided decoding with its speculation",
    backend="trtllm.trtllm_server:TrtllmEngineServerBackend",
    methods=("ar", *ENGINE_DECODING),
    needs_drafter=frozenset({"eagle", "medusa"}),
    # each start converts the HF checkpoint and builds a TensorRT engine (trtllm-serve --backend
    # tensorrt) before serving: tens of minutes for a 33B-70B model.  An estimate for the dry run's
    # ledger (no GPU has been lent to measure it), well above the 60 s it was priced at.
    start_s=1800.0,
    # `--backend tensorrt` is removed after TensorRT-LLM 1.2: rows of a newer install are refused
    versions=(None, "1.3"),
    **_COMMON,
)
DECLARATIONS = (TRTLLM, TRTLLM_ENGINE)
