"""HF transformers' declaration: assisted generation (draft model), prompt lookup and early
exit beside AR, batch size 1 (transformers' assisted generation is batch-1)."""

from __future__ import annotations

from ..declaration import EngineDeclaration

HF = EngineDeclaration(
    framework="hf",
    backend="hf.backend:HfBackend",
    methods=("ar", "ngram", "draft_target", "layer_skip"),
    method_options={"ngram": ("ngram_min", "ngram_max"), "layer_skip": ("exit_layer", "layers")},
    engine_options=(
        "max_matching_ngram_size",
        "assistant_confidence_threshold",
        "model_obj",
        "drafter_obj",
        "tokenizer",
    ),
    needs_drafter=frozenset({"draft_target"}),
    tokenizing=True,
    takes_device=True,
    max_batch=1,
    requirement=("transformers", "the base install (pip install -e .)"),
)
