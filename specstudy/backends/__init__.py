"""Backends: every engine is driven through :class:`specstudy.backends.base.Backend`.

``get_backend(framework, model=..., drafter=..., **options)`` imports the module lazily, so a
missing optional engine (vLLM, SGLang) only fails when asked for, naming the extra to install.
"""

from __future__ import annotations

import importlib
from typing import Any

from .base import Backend, BackendUnavailable

# framework name -> "module:Class" under specstudy.backends
BACKENDS: dict[str, str] = {
    "reference": "reference.backend:ReferenceBackend",
    "hf": "hf.backend:HfBackend",
    "vllm": "vllm.offline:VllmOfflineBackend",
    "vllm-server": "vllm.server:VllmServerBackend",
    "sglang": "sglang.server:SglangServerBackend",
    "openai": "openai.server:OpenAIBackend",
    "trtllm": "trtllm.server:TrtllmServerBackend",
    "llamacpp": "llamacpp.backend:LlamaCppBackend",
}


def framework_names() -> list[str]:
    return sorted(BACKENDS)


def get_backend(framework: str, **options: Any) -> Backend:
    if framework not in BACKENDS:
        raise ValueError(f"framework={framework!r} is not known; allowed: {framework_names()}")
    module, cls = BACKENDS[framework].split(":")
    mod = importlib.import_module(f"specstudy.backends.{module}")
    backend: Backend = getattr(mod, cls)(**options)
    return backend


__all__ = ["Backend", "BackendUnavailable", "BACKENDS", "framework_names", "get_backend"]
