"""Any OpenAI-compatible server (TensorRT-LLM ``trtllm-serve``, MLC-LLM, a user's own server):
stream ``/v1/completions``, time every chunk, read acceptance where the server reports it.

The server is started from ``command=`` (with ``{port}``, ``{host}``, ``{model}``, ``{drafter}``,
``{gamma}`` placeholders) or attached with ``base_url=``.  llama.cpp has its own backend
(framework ``llamacpp``), which also starts or attaches to a ``llama-server``.
"""

from __future__ import annotations

from typing import Any

from ...frameworks.openai import OPENAI
from ..server_base import ServerBackend


class OpenAIBackend(ServerBackend):
    """A generic OpenAI-compatible server; started from ``command=`` or attached via ``base_url=``."""

    framework = "openai"
    methods = OPENAI.methods

    def __init__(self, model: str, drafter: str | None = None, **options: Any):
        if options.get("preset") is not None:  # the old llama.cpp preset: one backend per engine now
            raise ValueError(
                f"preset={options['preset']!r} is no longer supported: use framework 'llamacpp' "
                "(llama_server=PATH for your own binary, base_url=URL for a running server)"
            )
        options.pop("preset", None)
        super().__init__(model, drafter, **options)
