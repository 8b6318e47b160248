"""The reference engine's declaration.  Its methods' own options, drafter needs and batch limits
are registered with each method (:mod:`specstudy.engine.methods`, one module per method), which
the backend's cell check reads; a test keeps :data:`METHODS` equal to that registry.
"""

from __future__ import annotations

from ..declaration import EngineDeclaration

METHODS = ("ar", "draft_target", "ngram", "layer_skip", "heads", "tree", "eagle", "specinfer", "sequoia")
#: the framework options its constructor reads
CONSTRUCTOR_OPTIONS = ("threads", "tokenizer", "chat")

REFERENCE = EngineDeclaration(
    framework="reference",
    backend="reference.backend:ReferenceBackend",
    methods=METHODS,
    engine_options=CONSTRUCTOR_OPTIONS,
    needs_drafter=frozenset({"draft_target", "heads", "tree", "eagle", "specinfer", "sequoia"}),
    drafter_per_cell=True,
    tokenizing=True,
    takes_device=True,
    requirement=("torch", "the base install (pip install -e .)"),
)
