"""TensorRT-LLM 1.2's declaration (``trtllm-serve``): ``decoding_type`` Eagle/Eagle3, Medusa,
DraftTarget, NGram, MTP.  Medusa and EAGLE-1/2 checkpoints need the TensorRT engine backend
(``--backend tensorrt``); the PyTorch backend runs only EAGLE-3, DraftTarget and NGram.
"""

from __future__ import annotations

from ..declaration import EngineDeclaration

#: kit method -> TensorRT-LLM decoding_type, and the runtime backend it needs
KIT_TO_TRTLLM = {
    "draft_target": ("DraftTarget", "pytorch"),
    "ngram": ("NGram", "pytorch"),
    "eagle3": ("Eagle3", "pytorch"),
    "eagle": ("Eagle", "tensorrt"),
    "medusa": ("Medusa", "tensorrt"),
}
#: the cell options the TensorRT-LLM backend reads, per method
TRTLLM_METHOD_OPTIONS = {"ngram": ("ngram_max",), "medusa": ("medusa_choices",), "eagle": ("eagle_choices",)}

TRTLLM = EngineDeclaration(
    framework="trtllm",
    backend="trtllm.server:TrtllmServerBackend",
    methods=("ar", *KIT_TO_TRTLLM),
    method_options=TRTLLM_METHOD_OPTIONS,
    needs_drafter=frozenset({"draft_target", "eagle", "eagle3", "medusa"}),
    server=True,
    tensor_parallel=True,
    environment=None,  # trtllm-serve is the user's own install (preflight looks for it on PATH)
    requirement=None,
)
