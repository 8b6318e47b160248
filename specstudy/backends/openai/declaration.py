"""Any OpenAI-compatible server named by URL: the kit cannot see its speculation, only its stream."""

from __future__ import annotations

from ..declaration import EngineDeclaration

OPENAI = EngineDeclaration(
    framework="openai",
    backend="openai.server:OpenAIBackend",
    methods=("ar", "ngram", "draft_target"),
    method_options={"*": ("ngram_min", "ngram_max")},
    server=True,
    requirement=("urllib", "nothing (any OpenAI-compatible server URL)"),
)
