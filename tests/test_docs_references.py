"""The README and docs/ name only what exists: each repository path, each ``specstudy`` subcommand and
flag, each ``make`` target they mention (modules are renamed, flags move: the prose must follow)."""

from __future__ import annotations

import re
from pathlib import Path

from specstudy.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: a repository path as the docs write it (placeholders such as <gpu> and globs are left out)
PATH = re.compile(r"(?<![\w/.<-])((?:specstudy|tests|bench|scripts|params|notebooks|docs)/[\w./-]*\w)(?![\w<*])")
COMMAND = re.compile(r"specstudy ([a-z][\w-]*)([^`|;\n]*)")
TARGET = re.compile(r"\bmake ([a-z][\w-]*)(?![\w*-])")  # `make bench-*` is a family, not a target


def missing_paths(text: str, here: Path) -> list[str]:
    """Paths that exist neither from the repository root nor beside the document."""
    return sorted({p for p in PATH.findall(text) if not (ROOT / p).exists() and not (here / p).exists()})


def unknown_flags(text: str) -> list[str]:
    """``specstudy CMD --flag`` mentions whose flag CMD does not take (prose words after "specstudy" skipped)."""
    commands = build_parser()._subparsers._group_actions[0].choices
    out = []
    for cmd, rest in COMMAND.findall(text):
        if cmd in commands:
            flags = {o for a in commands[cmd]._actions for o in a.option_strings}
            out += [f"specstudy {cmd} {f}" for f in re.findall(r"(?<![\w-])(--[a-z][\w-]*)", rest) if f not in flags]
    return sorted(set(out))


def unknown_targets(text: str) -> list[str]:
    """``make TARGET`` mentions with no such target in the Makefile."""
    makefile = (ROOT / "Makefile").read_text()
    targets = set(re.findall(r"^([\w.-]+)\s*:(?!=)", makefile, re.M))
    targets |= {t for line in re.findall(r"^\.PHONY:(.*)$", makefile, re.M) for t in line.split()}
    return sorted({t for t in TARGET.findall(text) if t not in targets})


def test_the_docs_name_only_paths_commands_flags_and_targets_that_exist():
    found = {
        doc.relative_to(ROOT).as_posix(): missing_paths(doc.read_text(), doc.parent)
        + unknown_flags(doc.read_text())
        + unknown_targets(doc.read_text())
        for doc in DOCS
    }
    assert {doc: bad for doc, bad in found.items() if bad} == {}


def test_a_renamed_path_a_gone_flag_and_a_gone_target_are_named():
    text = "see `specstudy/run/study.py`; run `specstudy study --no-such-flag`, then `make study-everything`"
    assert missing_paths(text, ROOT) == ["specstudy/run/study.py"]
    assert unknown_flags(text) == ["specstudy study --no-such-flag"]
    assert unknown_targets(text) == ["study-everything"]
