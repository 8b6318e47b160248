"""Where the kit lives: the package and the repository root (relative drafter, task and params
paths are read against it).  Imports nothing, so the torch-only parts (the reference engine, the
GPU check) can use it without the kit's configuration."""

from __future__ import annotations

from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_ROOT.parent
