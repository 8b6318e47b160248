"""Backends: every engine is driven through :class:`specstudy.backends.base.Backend`.

Each engine's code lives in its own package (``vllm/``, ``llamacpp/``, ``sglang/``, ``trtllm/``,
``hf/``, ``reference/``, ``openai/``), with its declaration (``declaration.py``: methods,
options, server or in-process, environment) collected in :mod:`.registry`.
``get_backend(framework, model=..., drafter=..., **options)`` imports the module lazily, so a
missing optional engine (vLLM, SGLang) only fails when asked for, naming the extra to install.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .registry import DECLARATIONS, declaration

if TYPE_CHECKING:
    from .base import Backend


def framework_names() -> list[str]:
    return sorted(DECLARATIONS)


def backend_class(framework: str) -> type[Backend]:
    """The backend class of ``framework`` (its module imported, no engine started)."""
    module, cls = declaration(framework).backend.split(":")
    found: type[Backend] = getattr(importlib.import_module(f"specstudy.backends.{module}"), cls)
    return found


def get_backend(framework: str, **options: Any) -> Backend:
    return backend_class(framework)(**options)


__all__ = ["DECLARATIONS", "backend_class", "declaration", "framework_names", "get_backend"]
