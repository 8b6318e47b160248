"""Backends: every engine is driven through :class:`specstudy.backends.base.Backend`.

Each engine's code lives in its own package (``vllm/``, ``llamacpp/``, ``sglang/``, ``trtllm/``, ``mlc/``,
``hf/``, ``reference/``, ``openai/``); what it is and reads is its declaration in the catalogue
(:mod:`specstudy.frameworks`), which this package and everything else read.
``get_backend(framework, model=..., drafter=..., **options)`` imports the module lazily, so a
missing optional engine (vLLM, SGLang) only fails when asked for, naming the extra to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ..frameworks import DECLARATIONS, declaration

if TYPE_CHECKING:
    from .base import Backend


def framework_names() -> list[str]:
    return sorted(DECLARATIONS)


def backend_class(framework: str) -> type[Backend]:
    """The backend class of ``framework`` (its module imported, no engine started).

    A framework declared on another engine's backend (an OpenAI-compatible server is one declaration
    over ``openai.openai_server:OpenAIBackend``) gets that class under its own name and methods."""
    decl = declaration(framework)
    module, name = decl.backend.split(":")
    found: type[Backend] = getattr(importlib.import_module(f"specstudy.backends.{module}"), name)
    if found.framework == framework:
        return found
    return type(f"{name}[{framework}]", (found,), {"framework": framework, "methods": decl.methods})


def get_backend(framework: str, **options: Any) -> Backend:
    return backend_class(framework)(**options)


__all__ = ["DECLARATIONS", "backend_class", "declaration", "framework_names", "get_backend"]
