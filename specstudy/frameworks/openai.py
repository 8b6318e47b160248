"""Any OpenAI-compatible server named by URL: the kit cannot see its speculation, only its stream."""

from __future__ import annotations

from .declaration import EngineDeclaration

OPENAI = EngineDeclaration(
    framework="openai",
    backend="openai.openai_server:OpenAIBackend",
    methods=("ar", "ngram", "draft_target"),
    method_options={"*": ("ngram_min", "ngram_max")},
    engine_options={
        "command": None,  # the command line that starts the server ({port}, {host}, {model}, ...)
        "prefix_cache": None,  # recorded; the server runs with what it was started with
        "dtype": None,  # recorded likewise
    },
    server=True,
    http=True,
    serve_bench=True,
    requirement=("urllib", "nothing (any OpenAI-compatible server URL)"),
)
DECLARATIONS = (OPENAI,)
