"""Is this machine the one a study's profile describes, with the engines its frameworks need?

Separate from validation, so a GPU profile can be validated (and dry-run) on any machine.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Sequence
from pathlib import Path

from ..config import ParamsError, StudyConfig, hardware_names, load_hardware_profile
from ..config.vocab import FRAMEWORK_REQUIREMENTS, SERVER_FRAMEWORKS
from ..telemetry import gpu_names


def _gpu_token(device: str) -> str:
    """The distinctive part of a profile's device name (A100, H100, H200, RTX 4090)."""
    for tok in ("A100", "H100", "H200", "4090", "L40S", "L4", "A10"):
        if tok.lower() in device.lower():
            return tok
    return device


def check_environment(cfg: StudyConfig, force: bool = False, gpus: Sequence[str] | None = None,
                      find_module=None) -> list[str]:
    """Refuse a GPU profile on a machine without that GPU (unless ``force``) and missing backends.

    Returns the warnings printed; raises :class:`ParamsError` on a refusal.
    """
    find_module = find_module or importlib.util.find_spec
    notes = []
    prof = load_hardware_profile(cfg.hardware, measure=False) if cfg.hardware in hardware_names() else None
    if prof is not None and prof.kind == "gpu":
        gpus = gpu_names() if gpus is None else list(gpus)
        tok = _gpu_token(prof.device)
        if not any(tok.lower() in g.lower() for g in gpus):
            msg = (f"{cfg.file}: hardware={cfg.hardware!r} describes {prof.device}, but this machine has "
                   f"{', '.join(gpus) if gpus else 'no NVIDIA GPU'}")
            if not force:
                raise ParamsError(cfg.file, "hardware", cfg.hardware,
                                  [n for n in hardware_names() if n == "cpu" or any(_gpu_token(n).lower() in g.lower() for g in gpus)] or ["cpu"],
                                  "this GPU is not here; pass --force to run anyway")
            notes.append(msg + " (--force: running anyway; numbers belong to this machine, not the profile)")
    used = sorted({f for sw in cfg.sweeps for f in sw.frameworks})
    for fw in used:
        module, extra = FRAMEWORK_REQUIREMENTS.get(fw, (None, None))
        if module is None:
            continue
        python = cfg.framework_options.get(fw, {}).get("python")
        if python and fw in SERVER_FRAMEWORKS:  # the server runs under its own interpreter (e.g. .venv-engines)
            if not Path(str(python)).expanduser().exists():
                raise ParamsError(cfg.file, f"study.framework_options.{fw}.python", python,
                                  "an existing Python interpreter with the engine installed", f"install {extra} there")
            continue
        try:
            found = find_module(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise ParamsError(cfg.file, "study.frameworks", fw, [f for f in used if f != fw] or ["reference"],
                              f"backend {fw!r} needs the python module {module!r}: install {extra}")
    for n in notes:
        warnings.warn(n, stacklevel=2)
    return notes
