"""docs/options.md stays true: every option an engine declaration or a reference method's ``HEADER`` names
has a row there, under a heading that names its framework, with a default; no row names an option that
no engine of its section reads.  The options are collected from the catalogue when the test runs, so an
engine or method added later fails here until it is documented."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specstudy import frameworks
from specstudy.frameworks import DECLARATIONS, EngineDeclaration
from specstudy.frameworks.reference import METHOD_DIRS_ENV, method_headers

DOC = Path(__file__).resolve().parents[1] / "docs" / "options.md"
#: what stands for "a framework option" where a method name stands for a cell option
FRAMEWORK = "framework option"
EMPTY = {"", "-", "—"}


@dataclass(frozen=True)
class Row:
    """One table row: the frameworks its ``##`` heading names, the option, who takes it, its default."""

    frameworks: frozenset[str]
    option: str
    taken_by: str
    default: str


def doc_rows(text: str, known: set[str]) -> list[Row]:
    """Every option row (a line starting ``| `name` |``), with the frameworks of its section."""
    rows, section = [], frozenset[str]()
    for line in text.splitlines():
        if line.startswith("## "):
            section = frozenset(t for t in re.findall(r"`([^`]+)`", line) if t in known)
        elif line.startswith("| `"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows.append(Row(section, cells[0].strip("`"), cells[1], cells[2]))
    return rows


def declared(decls: Mapping[str, EngineDeclaration]) -> set[tuple[str, str, str]]:
    """(framework, option, method) of every cell option ("*": each speculative method), (framework,
    option, FRAMEWORK) of every framework option; the reference engine's also read from its headers."""
    out: set[tuple[str, str, str]] = set()
    for fw, d in decls.items():
        for method, names in d.method_options.items():
            methods = [m for m in d.methods if m != "ar"] if method == "*" else [method]
            out |= {(fw, name, m) for name in names for m in methods}
        out |= {(fw, name, FRAMEWORK) for name in d.options_read()}
    if "reference" in decls:
        out |= {("reference", name, m) for m, h in method_headers().items() for name in h.options}
    return out


def covers(row: Row, fw: str, option: str, method: str) -> bool:
    """Whether ``row`` documents ``option`` of ``fw`` for ``method`` (or as a framework option)."""
    if fw not in row.frameworks or row.option != option:
        return False
    named = set(re.findall(r"`([^`]+)`", row.taken_by))
    if method == FRAMEWORK:
        return FRAMEWORK in row.taken_by and (fw in named or not named & row.frameworks)
    if FRAMEWORK in row.taken_by:
        return False
    every = "every method" in row.taken_by or (method != "ar" and "every speculative method" in row.taken_by)
    return every or method in named


def header_defaults() -> dict[tuple[str, str], Any]:
    """(method, option) -> the default its method file's HEADER states (``option_defaults``, where a
    header has one)."""
    return {(m, o): v for m, h in method_headers().items() for o, v in getattr(h, "option_defaults", {}).items()}


def contradicted(rows: list[Row], defaults: Mapping[tuple[str, str], Any]) -> list[str]:
    """Reference-engine rows whose default does not state the value the method's header gives."""
    return [
        f"reference: {option} of {method}: the header's default {value!r} is not in the row's default {r.default!r}"
        for (method, option), value in defaults.items()
        for r in rows
        if covers(r, "reference", option, method) and str(value).lower() not in r.default.lower()
    ]


def problems(text: str, decls: Mapping[str, EngineDeclaration]) -> list[str]:
    """Each option without a row, each row with an empty default, each row no engine of its section reads,
    each reference row whose default contradicts its method's header."""
    rows, wanted = doc_rows(text, set(decls)), declared(decls)
    missing = sorted(
        f"{fw}: {option} ({FRAMEWORK if m == FRAMEWORK else 'method ' + m}) has no row"
        for fw, option, m in wanted
        if not any(covers(r, fw, option, m) for r in rows)
    )
    read = {(fw, option) for fw, option, _ in wanted}
    empty = [f"{'/'.join(sorted(r.frameworks))}: {r.option} has an empty default" for r in rows if r.default in EMPTY]
    stale = [
        f"{'/'.join(sorted(r.frameworks)) or 'no framework'}: {r.option} is read by none of its section's frameworks"
        for r in rows
        if not any((fw, r.option) in read for fw in r.frameworks)
    ]
    wrong = contradicted(rows, header_defaults()) if "reference" in decls else []
    return missing + empty + stale + wrong


def test_every_declared_option_has_a_row_with_its_default():
    found = problems(DOC.read_text(), DECLARATIONS)
    assert found == [], "docs/options.md is out of date:\n" + "\n".join(found)


def test_an_engine_registered_with_new_options_is_named():
    probe = EngineDeclaration(
        framework="docs-probe",
        backend="openai.openai_server:OpenAIBackend",
        methods=("ar", "ngram"),
        method_options={"ngram": ("probe_cell_option",)},
        engine_options={"probe_framework_option": None},
    )
    frameworks.register(probe)
    try:
        found = problems(DOC.read_text(), DECLARATIONS)
    finally:
        frameworks.unregister("docs-probe")
    assert found == [
        "docs-probe: probe_cell_option (method ngram) has no row",
        "docs-probe: probe_framework_option (framework option) has no row",
    ]
    assert problems(DOC.read_text(), DECLARATIONS) == []  # gone with the engine


def test_a_method_header_with_a_new_option_is_named(tmp_path, monkeypatch):
    (tmp_path / "probe_method.py").write_text(
        'HEADER = {"name": "probe_method", "family": "ngram", "order": 100, "options": ("ngram_max", "probe_knob")}\n'
    )
    monkeypatch.setenv(METHOD_DIRS_ENV, str(tmp_path))
    frameworks.reload_methods()
    try:
        found = problems(DOC.read_text(), DECLARATIONS)
    finally:
        monkeypatch.delenv(METHOD_DIRS_ENV)
        frameworks.reload_methods()
    # ngram_max's rows name the methods that take it, not this one: the row must say so too
    assert found == [
        "reference: ngram_max (method probe_method) has no row",
        "reference: probe_knob (method probe_method) has no row",
    ]


def test_an_empty_default_and_a_row_no_engine_reads_are_named():
    extra = (
        "\n## `hf` again\n\n"
        "| `max_matching_ngram_size` | framework option |  | an int | gone default |\n"
        "| `no_such_option` | framework option | 1 | an int | read by nothing |\n"
    )
    assert problems(DOC.read_text() + extra, DECLARATIONS) == [
        "hf: max_matching_ngram_size has an empty default",
        "hf: no_such_option is read by none of its section's frameworks",
    ]


def test_a_default_that_contradicts_the_methods_header_is_named():
    rows = doc_rows(DOC.read_text(), set(DECLARATIONS))
    assert contradicted(rows, {("eagle", "tree_topk"): 4, ("sequoia", "tree_nodes"): 4}) == []
    assert contradicted(rows, {("eagle3", "tree_topk"): 5}) == [
        "reference: tree_topk of eagle3: the header's default 5 is not in the row's default '4'"
    ]
