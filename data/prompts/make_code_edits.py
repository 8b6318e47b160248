"""Write code_edits.jsonl: multi-turn code edits of the kit's own functions (issue 37 §4).

Each record is a conversation of three user turns over one short function of ``specstudy/``: an
edit that returns the whole function, then two more edits of the answer so far.  Every answer copies
most of the context (the function, then the previous answer), the agentic, repetitive output where
suffix decoding and prompt lookup draft long runs.  Run from the repository root:
``python data/prompts/make_code_edits.py`` (deterministic: the same sources give the same file).
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("specstudy/metrics.py", "specstudy/costmodel.py", "specstudy/records.py", "specstudy/synthetic.py")
OUT = Path(__file__).resolve().parent / "code_edits.jsonl"
LINES = (6, 22)  # functions of this many lines: the answers fit 32-256 new tokens
PER_FILE = 6


def functions(path: Path) -> list[ast.FunctionDef]:
    """Top-level functions with a parameter, of a length an answer can copy whole."""
    tree = ast.parse(path.read_text())
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.args.args]
    return [f for f in found if LINES[0] <= (f.end_lineno or 0) - f.lineno + 1 <= LINES[1]][:PER_FILE]


def turns(source: str, fn: ast.FunctionDef) -> list[str]:
    old = fn.args.args[0].arg
    new = f"{old}_value" if not old.endswith("_value") else f"{old}_in"
    return [
        "Here is a Python function from our code base:\n\n```python\n"
        + source
        + f"\n```\n\nRename the parameter `{old}` to `{new}` everywhere in it. Reply with the complete function only.",
        "Now add a comment line `# checked` directly above every `return` statement. "
        "Reply with the complete function again.",
        f"Now rename the function to `{fn.name}_v2`. Reply with the complete function again.",
    ]


def records() -> list[dict[str, object]]:
    out = []
    for rel in SOURCES:
        path = ROOT / rel
        text = path.read_text().splitlines()
        for fn in functions(path):
            source = "\n".join(text[fn.lineno - 1 : fn.end_lineno])
            out.append({"id": f"{Path(rel).stem}.{fn.name}", "source": rel, "turns": turns(source, fn)})
    return out


if __name__ == "__main__":
    rows = records()
    OUT.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    print(f"{OUT}: {len(rows)} conversations")
