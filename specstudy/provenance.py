"""Where a study's numbers came from: git state, package versions, host, environment, date."""

from __future__ import annotations

import datetime as _dt
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from .frameworks import provenance_packages as engine_packages
from .telemetry import host_info


def _git(*args: str) -> str:
    try:
        return subprocess.run(
            ["git", *args], capture_output=True, text=True, timeout=5, cwd=Path(__file__).resolve().parent.parent
        ).stdout.strip()
    except Exception:
        return ""


#: the kit's own stack; each engine's packages come from its declaration (specstudy.frameworks)
KIT_PACKAGES = (
    "specstudy",
    "torch",
    "transformers",
    "numpy",
    "pandas",
    "pyarrow",
    "papermill",
    "seaborn",
    "matplotlib",
    "nvidia-ml-py",
    "datasets",
)


def provenance_packages() -> tuple[str, ...]:
    """The kit's packages, then every declared engine's, each once."""
    return tuple(dict.fromkeys((*KIT_PACKAGES, *engine_packages())))


def provenance() -> dict[str, Any]:
    """Git sha (and whether the tree was dirty), package versions, CPU/GPU model, driver, date."""
    versions = {}
    for p in provenance_packages():
        try:
            versions[p] = metadata.version(p)
        except metadata.PackageNotFoundError:
            pass
    sha = _git("rev-parse", "HEAD")
    dirty = bool(_git("status", "--porcelain", "--untracked-files=no"))
    env = {
        k: os.environ.get(k)
        for k in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "HF_HUB_OFFLINE")
        if os.environ.get(k) is not None
    }
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        # what was run: the make target that set SPECSTUDY_COMMAND, else this process's command line
        "command": os.environ.get("SPECSTUDY_COMMAND") or " ".join(sys.argv),
        "git_sha": sha,
        "git_dirty": dirty,
        "packages": versions,
        "host": host_info(),
        "env": env,
    }
