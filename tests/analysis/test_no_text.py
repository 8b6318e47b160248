"""Strings for a reader are made in ``report/`` only: analysis returns numbers, typed rows and verdicts.

Why: text made in analysis cannot be followed back to its numbers (the summary's "AL 2.00" was a
dict lookup), and the same verdict got worded in two places.  The walk below finds every f-string and
``str.format`` call in ``specstudy/analysis/`` that makes text (literal words, spaces or a number
format), leaving out exception messages and names built from parts (``f"{name}_ci"``): none may
make one.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import specstudy.analysis

ANALYSIS = Path(specstudy.analysis.__file__).parent
NAME_PART = re.compile(r"^[A-Za-z0-9_.]*$")


def _raised(tree: ast.AST) -> set[int]:
    """Nodes inside a ``raise``: an exception's message is for the developer, not the report."""
    return {id(n) for r in ast.walk(tree) if isinstance(r, ast.Raise) for n in ast.walk(r)}


def _makes_text(node: ast.JoinedStr) -> bool:
    """An f-string that reads as text: literal words or spaces, or a value formatted for display."""
    literal = "".join(v.value for v in node.values if isinstance(v, ast.Constant) and isinstance(v.value, str))
    formatted = any(isinstance(v, ast.FormattedValue) and v.format_spec is not None for v in node.values)
    return formatted or not NAME_PART.match(literal)


def text_strings(source: str) -> list[int]:
    """Line numbers of the text-making f-strings and ``.format`` calls of a module (nested ones once)."""
    tree = ast.parse(source)
    skip = _raised(tree)
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            skip |= {id(x) for x in ast.walk(n) if x is not n and isinstance(x, ast.JoinedStr)}
    lines = []
    for n in ast.walk(tree):
        if id(n) in skip:
            continue
        if isinstance(n, ast.JoinedStr) and _makes_text(n):
            lines.append(n.lineno)
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "format":
            if isinstance(n.func.value, ast.Constant) and isinstance(n.func.value.value, str):
                lines.append(n.lineno)
    return sorted(lines)


def test_analysis_makes_no_text():
    found = {p.name: text_strings(p.read_text()) for p in sorted(ANALYSIS.glob("*.py"))}
    making = {name: f"text strings at lines {lines}" for name, lines in found.items() if lines}
    assert making == {}, "make the text in specstudy/report/ from a typed value instead"


def test_the_walk_tells_text_from_names_and_errors():  # the checks above can fail
    src = """
def f(label, gamma, x, name):
    key = f"{name}_ci"
    if x is None:
        raise ValueError(f"x={x!r}: expected a number")
    return f"{label} γ={gamma}", f"{x:.2f}", "{} rows".format(3), key
"""
    assert text_strings(src) == [6, 6, 6]
