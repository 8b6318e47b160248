"""The engine catalogue, the kit's ground floor: every engine's declaration by framework name.

One module per engine (``specstudy/frameworks/<engine>.py``) defines ``DECLARATIONS``, a tuple of
:class:`~.declaration.EngineDeclaration`; this registry collects them, and everything above
(validation, the plan, the dry run, preflight, installs, provenance, the backends) reads them
here.  An OpenAI-compatible server with no counters of its own is one declaration whose backend is
``openai.server:OpenAIBackend``; :func:`register` adds one from anywhere (a user's module, a test).
This package imports nothing above :mod:`specstudy.metrics`.
"""

from __future__ import annotations

from collections.abc import Iterable

from . import hf, llamacpp, mlc, openai, reference, sglang, trtllm, vllm
from .declaration import EngineDeclaration, EngineEnv

#: every framework a study can name -> its declaration (the kit's engines; :func:`register` adds more)
DECLARATIONS: dict[str, EngineDeclaration] = {
    d.framework: d for m in (reference, hf, llamacpp, vllm, sglang, trtllm, mlc, openai) for d in m.DECLARATIONS
}


def register(decl: EngineDeclaration, *, replace: bool = False) -> EngineDeclaration:
    """Add an engine to the catalogue (a study may then name ``decl.framework``); returns it."""
    if decl.framework in DECLARATIONS and not replace and DECLARATIONS[decl.framework] != decl:
        raise ValueError(f"framework={decl.framework!r} is already declared; pass replace=True to redeclare it")
    if not decl.methods or decl.methods[0] != "ar":
        raise ValueError(f"framework={decl.framework!r}: methods must start with 'ar', got {decl.methods!r}")
    DECLARATIONS[decl.framework] = decl
    return decl


def reload_methods() -> EngineDeclaration:
    """Re-read the reference engine's method files (a method folder added to ``SPECSTUDY_METHOD_DIRS``
    since import): its declaration is derived from their headers."""
    reference._headers.cache_clear()
    return register(reference.declaration(), replace=True)


def unregister(framework: str) -> None:
    """Remove a framework :func:`register` added (tests)."""
    DECLARATIONS.pop(framework, None)


def frameworks() -> tuple[str, ...]:
    """Every framework a study can name, in catalogue order."""
    return tuple(DECLARATIONS)


def declaration(framework: str) -> EngineDeclaration:
    """The declaration of ``framework``; ValueError naming the known ones."""
    if framework not in DECLARATIONS:
        raise ValueError(f"framework={framework!r} is not known; allowed: {sorted(DECLARATIONS)}")
    return DECLARATIONS[framework]


def server_frameworks() -> tuple[str, ...]:
    """Frameworks whose speculation is fixed when the engine starts (one engine per method config)."""
    return tuple(f for f, d in DECLARATIONS.items() if d.server)


def drafter_per_cell() -> tuple[str, ...]:
    """In-process engines that load each cell's drafter themselves (one engine per target)."""
    return tuple(f for f, d in DECLARATIONS.items() if d.drafter_per_cell)


def tokenizing_frameworks() -> tuple[str, ...]:
    """Engines that hand the prompt loader their tokenizer: a task's input-length policy applies."""
    return tuple(f for f, d in DECLARATIONS.items() if d.tokenizing)


def tensor_parallel() -> tuple[str, ...]:
    """Frameworks that split a model over GPUs."""
    return tuple(f for f, d in DECLARATIONS.items() if d.tensor_parallel)


def environment_of(framework: str) -> str | None:
    """The kit-managed environment ``framework`` runs in ("vllm", "sglang"), None without one."""
    return declaration(framework).environment


def environments() -> dict[str, EngineEnv]:
    """Every pinned engine environment by name (each once, however many frameworks share it)."""
    return {env.name: env for d in DECLARATIONS.values() for env in d.environments}


def environment_frameworks(engine: str) -> tuple[str, ...]:
    """The frameworks that run in ``engine``'s environments."""
    return tuple(f for f, d in DECLARATIONS.items() if d.environment == engine)


def method_families() -> dict[str, str]:
    """Engine method names outside the kit's families -> their family, from every declaration."""
    out: dict[str, str] = {}
    for d in DECLARATIONS.values():
        for method, family in d.method_families.items():
            if out.setdefault(method, family) != family:
                raise ValueError(f"method {method!r} is declared in two families: {out[method]!r} and {family!r}")
    return out


def provenance_packages() -> tuple[str, ...]:
    """The distributions the engines' declarations ask provenance to record."""
    return tuple(dict.fromkeys(p for d in DECLARATIONS.values() for p in d.provenance_packages))


def drafter_methods(decls: Iterable[EngineDeclaration] | None = None) -> frozenset[str]:
    """Methods that load a drafter on every framework that runs them and loads drafters at all (a
    server named by URL holds its own): a study row of one must name a drafter."""
    loaders = [d for d in (DECLARATIONS.values() if decls is None else decls) if d.needs_drafter]
    runs = {m for d in loaders for m in d.methods if m != "ar"}
    return frozenset(m for m in runs if all(m in d.needs_drafter for d in loaders if m in d.methods))


__all__ = [
    "DECLARATIONS",
    "EngineDeclaration",
    "EngineEnv",
    "declaration",
    "drafter_methods",
    "drafter_per_cell",
    "environment_frameworks",
    "environment_of",
    "environments",
    "frameworks",
    "method_families",
    "provenance_packages",
    "register",
    "reload_methods",
    "server_frameworks",
    "tensor_parallel",
    "tokenizing_frameworks",
    "unregister",
]
