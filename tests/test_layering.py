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


def test_every_module_name_is_unique_in_the_package():
    """A name says what the module holds: no two modules (packages aside) share a file name, so
    ``study.py`` can never again mean three things (the house issue)."""
    seen: dict[str, list[str]] = {}
    for p in ROOT.rglob("*.py"):
        if p.name != "__init__.py":
            seen.setdefault(p.stem, []).append(str(p.relative_to(ROOT)))
    assert {k: v for k, v in seen.items() if len(v) > 1} == {}


def test_no_test_is_named_after_an_issue_number():
    """Tests are named after behaviour (``test_n5_n10_trtllm.py`` said nothing to a newcomer)."""
    import re

    tests = Path(__file__).parent
    bad = [
        str(p.relative_to(tests))
        for p in tests.rglob("test_*.py")
        if re.search(r"(^|_)(n|issue)\d+(_|$)", p.stem) or re.search(r"def test_(n|issue)\d+_", p.read_text())
    ]
    assert bad == []


#: where a table may name engines or methods: their declarations, and code that is one engine's or one
#: drafter kind's own (each with why)
FACT_HOMES = {
    "frameworks/": "the engines' declarations",
    "engine/methods/": "the reference methods' own files (their HEADERs)",
    "engine/drafters.py": "drafter checkpoint kinds (heads, eagle, eagle3), not methods",
    "train/": "drafter training kinds",
    "commands/train_drafter_command.py": "drafter training kinds",
    "backends/llamacpp/": "llama.cpp's own driver: its method names",
    "backends/sglang/": "SGLang's own driver",
    "backends/trtllm/": "TensorRT-LLM's own driver",
    "backends/vllm/": "vLLM's own driver",
    "environments/drafter_preflight.py": "each drafter format's loader rules (keyed by the declarations' drafter_format)",
}


def _fact_tables(path: Path, names: set[str]) -> list[str]:
    """Literal tables in ``path`` that name engines or methods: a dict keyed by one, or a sequence of two or more."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Dict):
            consts = [k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)]
        elif isinstance(node, (ast.Tuple, ast.Set, ast.List)):
            consts = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        else:
            continue
        found = [c for c in consts if c in names]
        if (isinstance(node, ast.Dict) and found) or len(found) >= 2:
            out.append(f"{path.relative_to(ROOT)}:{node.lineno}: {found}")
    return out


def test_no_fact_about_a_named_engine_or_method_sits_in_a_table_outside_its_declaration():
    """A method's title, seed row, tree nature and what it drafts from live in its HEADER; an engine's in its
    declaration.  A literal table of method or engine names elsewhere is a second copy that drifts."""
    names = {m for d in DECLARATIONS.values() for m in (*d.methods, *d.method_families)} | set(DECLARATIONS)
    names -= {"ar"}  # the baseline is every table's first row, not a fact about a method
    found = [
        hit
        for p in sorted(ROOT.rglob("*.py"))
        if not str(p.relative_to(ROOT)).startswith(tuple(FACT_HOMES))
        for hit in _fact_tables(p, names)
    ]
    assert found == []


def test_the_fact_scan_finds_a_planted_table(tmp_path):
    planted = tmp_path / "leak.py"
    planted.write_text('TITLES = {"ngram": "Prompt lookup"}\nTREES = ("tree", "sequoia")\nOK = ("ar", "x")\n')
    names = {"ngram", "tree", "sequoia"}
    global ROOT
    root, ROOT = ROOT, tmp_path
    try:
        assert [h.split(": ")[1] for h in _fact_tables(planted, names)] == ["['ngram']", "['tree', 'sequoia']"]
    finally:
        ROOT = root
