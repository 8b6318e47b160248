"""HF transformers' declaration: assisted generation (draft model), prompt lookup and early
exit beside AR, batch size 1 (transformers' assisted generation is batch-1)."""

from __future__ import annotations

from .declaration import EngineDeclaration

HF = EngineDeclaration(
    framework="hf",
    backend="hf.hf_backend:HfBackend",
    methods=("ar", "ngram", "draft_target", "layer_skip"),
    method_options={
        "ngram": ("ngram_min", "ngram_max"),
        "layer_skip": ("exit_layer", "layers"),
        # transformers' num_assistant_tokens_schedule: "constant" (γ every step) or "heuristic" (its own)
        "draft_target": ("assistant_schedule",),
    },
    engine_options={
        # transformers' generation config fields
        "max_matching_ngram_size": "max_matching_ngram_size",
        "assistant_confidence_threshold": "assistant_confidence_threshold",
        "exit_layer": "assistant_early_exit",
        # objects handed in by a caller that already loaded them (tests, notebooks)
        "model_obj": None,
        "drafter_obj": None,
        "tokenizer": None,
    },
    needs_drafter=frozenset({"draft_target"}),
    schedule_options={"assistant_schedule": "constant"},
    tokenizing=True,
    takes_device=True,
    max_batch=1,
    requirement=("transformers", "the base install (pip install -e .)"),
    provenance_packages=("torch", "transformers"),
)
DECLARATIONS = (HF,)
