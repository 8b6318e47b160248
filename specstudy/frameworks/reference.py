"""The reference engine's declaration, derived from its method files.

A reference method is one file, ``specstudy/engine/methods/<name>.py`` (or one in a folder named
in ``SPECSTUDY_METHOD_DIRS``) holding, after its imports, a literal ``HEADER = {...}``: its name, family,
report order, whether it needs a drafter and γ, its largest batch and the names of its options.
This module reads each header with :mod:`ast` (a file read, not an import), so the catalogue stays
torch-free and below the engine, and the method list, drafter needs, aliases and option names are
derived, never kept equal by hand.  The engine builds each method's ``EngineMethod`` from the same
header (``EngineMethod.from_header``) and refuses one that differs from it.  A literal, not an
imported dataclass: the catalogue sits below the engine (it may not import it, even lazily), and a
literal is read without running the method's code or loading torch.
"""

from __future__ import annotations

import ast
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from .declaration import EngineDeclaration

#: the kit's own method files (read as files: the catalogue never imports the engine)
BUILTIN_METHODS = Path(__file__).resolve().parents[1] / "engine" / "methods"
#: more method folders, separated like PATH (a user's methods, a test's)
METHOD_DIRS_ENV = "SPECSTUDY_METHOD_DIRS"
#: cell options the reference backend reads for every method (the rest go to the method)
BACKEND_CELL_OPTIONS = ("chat",)


@dataclass(frozen=True)
class MethodHeader:
    """What a method file's ``HEADER`` says: everything a study is checked against without torch."""

    name: str
    family: str  # the report section; a method whose family is its own name founds a family
    order: int  # place in the method list and the report (families in this order)
    file: str = ""  # the file it was read from
    needs_drafter: bool = False
    uses_gamma: bool = True
    max_batch: int | None = None  # None: any batch size
    options: tuple[str, ...] = ()  # the option names its SPEC validates
    title: str = ""  # a family founder's report section title
    seed_row: str = ""  # the seed's hardware-table row it stands for ("": none)
    tree: bool = False  # verifies a token tree (a tree mask), not a chain
    block: bool = False  # drafts its γ tokens in one drafter forward (DFlash): c counts per forward
    drafts_from: str = ""  # what it drafts from when it loads no drafter model, as the tables say
    extra_weights: bool = False  # a family founder whose members hold weights beside the target's (memory)
    describe: str = ""  # what the engine runs, with {gamma} and the cell's options filled in
    #: option -> what the engine runs when the cell sets that option (the first one set wins)
    describe_when: Mapping[str, str] = field(default_factory=dict)
    #: the values the method's code takes for options a cell leaves out (where a sentence names them)
    option_defaults: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, header: dict[str, Any], file: str = "") -> MethodHeader:
        """A header from its literal dict; ValueError naming the file and the bad keys."""
        allowed = {f.name for f in fields(cls)} - {"file"}
        bad, missing = sorted(set(header) - allowed), sorted({"name", "family", "order"} - set(header))
        if bad or missing:
            raise ValueError(f"{file}: HEADER keys {bad} not allowed, {missing} missing; allowed: {sorted(allowed)}")
        return cls(
            **{
                **header,
                "options": tuple(header.get("options", ())),
                "describe_when": header.get("describe_when", {}),
                "option_defaults": header.get("option_defaults", {}),
            },
            file=file,
        )


def read_header(path: Path) -> MethodHeader | None:
    """The ``HEADER`` literal of a method file (None: the file has none, e.g. a helper module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "HEADER" for t in node.targets):
            header = MethodHeader.of(ast.literal_eval(node.value), str(path))
            if header.name != path.stem:
                raise ValueError(f"{path}: HEADER name {header.name!r} must be the file's name {path.stem!r}")
            return header
    return None


#: the entry-point group through which an installed package adds method folders (a package of method files)
METHOD_ENTRY_POINTS = "specstudy.methods"


def installed_method_folders() -> list[Path]:
    """The folders of the method packages installed packages declare (entry points of
    :data:`METHOD_ENTRY_POINTS`, each naming a package of method files); found, not imported."""
    import importlib.util
    from importlib.metadata import entry_points

    out: list[Path] = []
    for ep in entry_points(group=METHOD_ENTRY_POINTS):
        spec = importlib.util.find_spec(ep.module)
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(
                f"entry point {ep.name}={ep.value!r} ({METHOD_ENTRY_POINTS}): {ep.module!r} is not an installed "
                f"package; allowed: a package whose folder holds method files with a HEADER"
            )
        out.extend(Path(p) for p in spec.submodule_search_locations)
    return out


def method_folders() -> tuple[Path, ...]:
    """The kit's method folder, those of installed packages (entry points), then those named in
    :data:`METHOD_DIRS_ENV`."""
    extra = [Path(p) for p in os.environ.get(METHOD_DIRS_ENV, "").split(os.pathsep) if p]
    return (BUILTIN_METHODS, *installed_method_folders(), *extra)


def method_headers() -> dict[str, MethodHeader]:
    """Every reference method's header by name, in report order (ar first)."""
    return _headers(method_folders())


@lru_cache(maxsize=8)
def _headers(folders: tuple[Path, ...]) -> dict[str, MethodHeader]:
    found: dict[str, MethodHeader] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.py")):
            header = None if path.name.startswith("_") else read_header(path)
            if header is None:
                continue
            if header.name in found:
                raise ValueError(f"{path}: method {header.name!r} is already defined in {found[header.name].file}")
            found[header.name] = header
    return dict(sorted(found.items(), key=lambda kv: (kv[1].order, kv[0])))


def families() -> tuple[str, ...]:
    """The method families (the report's sections), in order: methods whose family is their own name."""
    return tuple(h.name for h in method_headers().values() if h.family == h.name)


def declaration() -> EngineDeclaration:
    """The reference engine's declaration, its method facts read from the method files now."""
    headers = method_headers()
    return EngineDeclaration(
        framework="reference",
        backend="reference.reference_backend:ReferenceBackend",
        methods=tuple(headers),
        method_options={m: (*h.options, *BACKEND_CELL_OPTIONS) for m, h in headers.items()},
        engine_options={
            "threads": "torch.set_num_threads",  # intra-op threads of the process
            "tokenizer": None,  # a tokenizer folder or name when the model's own is not wanted
            "chat": None,  # render prompts with the chat template ("auto", True, False)
        },
        method_families={m: h.family for m, h in headers.items() if h.family != m},
        needs_drafter=frozenset(m for m, h in headers.items() if h.needs_drafter),
        block_drafting=frozenset(m for m, h in headers.items() if h.block),
        drafter_per_cell=True,
        tokenizing=True,
        takes_device=True,
        requirement=("torch", "the base install (pip install -e .)"),
        provenance_packages=("torch", "transformers"),
    )


REFERENCE = declaration()
METHODS = REFERENCE.methods
DECLARATIONS = (REFERENCE,)
