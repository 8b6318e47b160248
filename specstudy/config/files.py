"""Where parameter files live and how they are read (YAML, mapping at the top, errors named)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..paths import REPO_ROOT
from .errors import ParamsError


def params_dir() -> Path:
    """Where ``params/`` lives: $SPECSTUDY_PARAMS, else the repository's own folder."""
    return Path(os.environ.get("SPECSTUDY_PARAMS", REPO_ROOT / "params"))


def display_path(path: str | os.PathLike[str]) -> str:
    """A path as a reader of the report wants it: relative to the repository when inside it."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(p)


def load_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    import yaml

    path = Path(path)
    if not path.exists():
        raise ParamsError(None, "file", str(path), "an existing YAML file")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ParamsError(path, "yaml", str(e).splitlines()[0], "valid YAML") from None
    if not isinstance(data, dict):
        raise ParamsError(path, "<top level>", type(data).__name__, "a mapping")
    return data


def hardware_names() -> list[str]:
    return sorted(p.stem for p in (params_dir() / "hardware").glob("*.yaml"))


def hardware_file(name: str) -> Path:
    path = params_dir() / "hardware" / f"{name}.yaml"
    if not path.exists():
        raise ParamsError(params_dir() / "hardware", "hardware", name, hardware_names())
    return path
