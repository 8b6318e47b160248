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

from ..declaration import EngineDeclaration

#: kit method -> TensorRT-LLM decoding_type, per runtime backend
PYTORCH_DECODING = {"draft_target": "DraftTarget", "ngram": "NGram", "eagle3": "Eagle"}
ENGINE_DECODING = {"eagle": "Eagle", "medusa": "Medusa"}
#: the cell options the TensorRT-LLM backends read, per method
TRTLLM_METHOD_OPTIONS = {"ngram": ("ngram_max",), "medusa": ("medusa_choices",), "eagle": ("eagle_choices",)}

_COMMON: dict[str, Any] = dict(
    method_options=TRTLLM_METHOD_OPTIONS,
    server=True,
    tensor_parallel=True,
    environment=None,  # trtllm-serve is the user's own install (preflight looks for it on PATH)
    requirement=None,
)
TRTLLM = EngineDeclaration(
    framework="trtllm",
    backend="trtllm.server:TrtllmServerBackend",
    methods=("ar", *PYTORCH_DECODING),
    needs_drafter=frozenset({"draft_target", "eagle3"}),
    **_COMMON,
)
TRTLLM_ENGINE = EngineDeclaration(
    framework="trtllm-engine",
    backend="trtllm.server:TrtllmEngineServerBackend",
    methods=("ar", *ENGINE_DECODING),
    needs_drafter=frozenset({"eagle", "medusa"}),
    **_COMMON,
)
