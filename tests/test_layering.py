"""The package's shape: no import circle anywhere (lazy and annotation-only imports counted), and
each engine declared once, in agreement with its backend class."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import specstudy
from specstudy.backends import backend_class
from specstudy.config.vocab import METHOD_ALIASES, METHOD_FAMILIES
from specstudy.frameworks import DECLARATIONS, frameworks

ROOT = Path(specstudy.__file__).parent


def _modules() -> dict[str, Path]:
    out = {}
    for p in ROOT.rglob("*.py"):
        parts = ("specstudy", *p.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every specstudy module ``name`` imports, wherever the import statement is."""
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg[: len(pkg) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            subs = {f"{base}.{a.name}" for a in node.names} & known
            found |= subs if len(subs) == len(node.names) else subs | {base}
    return (found & known) - {name}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (a list of modules, first == last), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(graph[v]):
            if state.get(w) == 1:
                return stack[stack.index(w) :] + [w]
            if w not in state and (c := visit(w)):
                return c
        state[v] = 2
        stack.pop()
        return None

    for v in sorted(graph):
        if v not in state and (c := visit(v)):
            return c
    return None


#: the packages (and top-level modules) from the ground floor up: an import may only point to a lower
#: floor.  The engine catalogue (frameworks) imports nothing above metrics.
FLOORS = (
    ("paths", "records", "synthetic", "drafter_names", "intervals", "cpu_time", "cpu_speed", "__init__"),
    ("telemetry",),
    ("metrics",),
    ("costmodel", "frameworks"),
    ("config", "layout", "provenance"),
    ("data",),
    ("engine", "environments"),
    ("backends", "train"),
    ("analysis",),
    ("report",),
    ("run",),
    ("commands", "cli"),
)


def _floor_of(module: str) -> int:
    part = module.split(".")[1] if "." in module else "__init__"
    return next(i for i, floor in enumerate(FLOORS) if part in floor)


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import that points to a higher floor (or between two packages of one floor)."""
    out = []
    for a, targets in graph.items():
        for b in sorted(targets):
            pa, pb = (x.split(".")[1] if "." in x else "__init__" for x in (a, b))
            if pa != pb and _floor_of(a) <= _floor_of(b):
                out.append(f"{a} -> {b}")
    return sorted(out)


def test_every_import_points_down_a_floor():
    mods = _modules()
    graph = {m: _imports(m, p, set(mods)) for m, p in mods.items()}
    assert {m.split(".")[1] if "." in m else "__init__" for m in mods} <= {p for f in FLOORS for p in f}
    assert _upward(graph) == []


def test_the_floor_check_finds_an_upward_import():  # the check above can fail
    graph = {"specstudy.config.schema": {"specstudy.backends.base"}, "specstudy.backends.base": {"specstudy.records"}}
    assert _upward(graph) == ["specstudy.config.schema -> specstudy.backends.base"]
    assert _upward({"specstudy.frameworks.vllm": {"specstudy.config.vocab"}}) == [
        "specstudy.frameworks.vllm -> specstudy.config.vocab"
    ]


def test_no_import_circle():
    mods = _modules()
    graph = {m: _imports(m, p, set(mods)) for m, p in mods.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_circle_finder_finds_a_circle():  # the check above can fail
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("framework", frameworks())
def test_each_backend_runs_what_its_declaration_says(framework):
    decl = DECLARATIONS[framework]
    cls = backend_class(framework)
    assert cls.framework == framework
    if framework != "reference":  # the reference engine's methods come from its registry (test_eagle)
        assert tuple(cls.methods) == decl.methods
    assert decl.methods[0] == "ar"
    known = set(METHOD_FAMILIES) | set(METHOD_ALIASES)
    assert set(decl.methods) | set(decl.needs_drafter) <= known


def test_test_folders_mirror_the_package():
    """Each test folder is named after the package folder it tests (fixtures aside), so a newcomer
    finds a module's tests where the module lives."""
    tests = Path(__file__).parent
    folders = {p.name for p in tests.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    packages = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    assert folders - packages == set()
