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


#: the entry-point group through which an installed package adds engines: each entry point names an
#: EngineDeclaration, a sequence of them, or a function returning either
ENGINE_ENTRY_POINTS = "specstudy.frameworks"


def register_installed() -> list[str]:
    """Register every engine an installed package declares (entry points of :data:`ENGINE_ENTRY_POINTS`),
    so the console script, the notebooks and a study see a user's own engines; returns their names."""
    from importlib.metadata import entry_points

    added = []
    for ep in entry_points(group=ENGINE_ENTRY_POINTS):
        found = ep.load()
        if callable(found) and not isinstance(found, EngineDeclaration):
            found = found()
        decls = found if isinstance(found, (tuple, list)) else [found]
        bad = [d for d in decls if not isinstance(d, EngineDeclaration)]
        if bad:
            raise ValueError(
                f"entry point {ep.name}={ep.value!r} ({ENGINE_ENTRY_POINTS}) gave {bad[0]!r}; allowed: an "
                f"EngineDeclaration, a sequence of them, or a function returning either"
            )
        added += [register(d).framework for d in decls]
    return added


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


def seed_row(method: str) -> str:
    """The seed's hardware-table row a method stands for ("": none): its header's, else what an engine
    declares of its own method name (``method_seed_rows``)."""
    header = reference.method_headers().get(method)
    if header is not None:
        return header.seed_row
    return next((d.method_seed_rows[method] for d in DECLARATIONS.values() if method in d.method_seed_rows), "")


def family_title(family: str) -> str:
    """A method family's report title, from its founding method's header (the family's name if none)."""
    header = reference.method_headers().get(family)
    return header.title if header is not None and header.title else family


def tree_methods() -> tuple[str, ...]:
    """Methods that verify a token tree (their headers say ``tree``)."""
    return tuple(m for m, h in reference.method_headers().items() if h.tree)


def block_drafting(framework: str, method: str) -> bool:
    """Whether ``method`` drafts its γ tokens in one drafter forward in ``framework`` (DFlash, PARD):
    its c is then a draft forward's cost, paid once per step whatever γ."""
    decl = DECLARATIONS.get(framework)
    return decl is not None and method in decl.block_drafting


def eagle_methods() -> tuple[str, ...]:
    """The EAGLE heads: the seed's EAGLE-2 row, a chain or EAGLE-2's dynamic tree."""
    return tuple(m for m, h in reference.method_headers().items() if h.seed_row == "EAGLE-2")


def drafts_from(method: str) -> str:
    """What a method that loads no drafter model drafts from ("": a drafter, or not declared)."""
    header = reference.method_headers().get(method)
    return header.drafts_from if header is not None else ""


def extra_weight_families() -> tuple[str, ...]:
    """Families whose members hold weights beside the target's (the seed expects them to cost memory)."""
    return tuple(m for m, h in reference.method_headers().items() if h.extra_weights)


def head_drafter_methods() -> frozenset[str]:
    """Methods whose drafter checkpoint is a head on the target's hidden states (its width and vocabulary
    must match the target's): the heads family's drafter methods of the engines that load checkpoints."""
    families = {**method_families(), **{m: h.family for m, h in reference.method_headers().items()}}
    return frozenset(
        m for d in DECLARATIONS.values() if d.drafter_format for m in d.needs_drafter if families.get(m) == "heads"
    )


def provenance_packages() -> tuple[str, ...]:
    """The distributions the engines' declarations ask provenance to record."""
    return tuple(dict.fromkeys(p for d in DECLARATIONS.values() for p in d.provenance_packages))


def drafter_methods(decls: Iterable[EngineDeclaration] | None = None) -> frozenset[str]:
    """Methods that load a drafter on every framework that runs them and loads drafters at all (a
    server named by URL holds its own): a study row of one must name a drafter."""
    loaders = [d for d in (DECLARATIONS.values() if decls is None else decls) if d.needs_drafter]
    runs = {m for d in loaders for m in d.methods if m != "ar"}
    return frozenset(m for m in runs if all(m in d.needs_drafter for d in loaders if m in d.methods))


# the reference engine's declaration already holds installed method packages (reference.method_folders)
register_installed()

__all__ = [
    "DECLARATIONS",
    "EngineDeclaration",
    "EngineEnv",
    "declaration",
    "drafter_methods",
    "drafts_from",
    "eagle_methods",
    "extra_weight_families",
    "family_title",
    "head_drafter_methods",
    "seed_row",
    "tree_methods",
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
