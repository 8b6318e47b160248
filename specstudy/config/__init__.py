"""Parameter files: one schema per file kind, validated before any model loads.

Every error names the file, the key path, the bad value and the allowed values
(:class:`ParamsError`).  Hardware profiles (:mod:`.hardware`), study matrices (:mod:`.study`),
model registry entries (:mod:`.model`) and task files (:mod:`.task`); one vocabulary of names
(:mod:`.vocab`).
"""

from .errors import ParamsError, ParamsProblems
from .files import display_path, hardware_file, hardware_names, load_yaml, params_dir
from .hardware import load_hardware_profile
from .model import ModelEntry, get_entry, model_names
from .schema import MethodSpec, ModelPair
from .study_matrix import StudyConfig, Sweep, load_study
from .task import TaskConfig, load_task_config, task_names

__all__ = [
    "MethodSpec",
    "ModelEntry",
    "ModelPair",
    "ParamsError",
    "ParamsProblems",
    "StudyConfig",
    "Sweep",
    "TaskConfig",
    "display_path",
    "get_entry",
    "hardware_file",
    "hardware_names",
    "load_hardware_profile",
    "load_study",
    "load_task_config",
    "load_yaml",
    "model_names",
    "params_dir",
    "task_names",
]
