"""The reference engine's declaration.  Its methods' own options, drafter needs and batch limits
are registered with each method (:mod:`specstudy.engine.methods`, one module per method), which
the backend's cell check reads; a test keeps :data:`METHODS` equal to that registry.
"""

from __future__ import annotations

from .declaration import EngineDeclaration

METHODS = ("ar", "draft_target", "ngram", "layer_skip", "heads", "tree", "eagle", "eagle3", "specinfer", "sequoia")

REFERENCE = EngineDeclaration(
    framework="reference",
    backend="reference.backend:ReferenceBackend",
    methods=METHODS,
    engine_options={
        "threads": "torch.set_num_threads",  # intra-op threads of the process
        "tokenizer": None,  # a tokenizer folder or name when the model's own is not wanted
        "chat": None,  # render prompts with the chat template ("auto", True, False)
    },
    method_families={"eagle": "heads", "eagle3": "heads", "specinfer": "tree", "sequoia": "tree"},
    needs_drafter=frozenset({"draft_target", "heads", "tree", "eagle", "eagle3", "specinfer", "sequoia"}),
    drafter_per_cell=True,
    tokenizing=True,
    takes_device=True,
    requirement=("torch", "the base install (pip install -e .)"),
    provenance_packages=("torch", "transformers"),
)
DECLARATIONS = (REFERENCE,)
