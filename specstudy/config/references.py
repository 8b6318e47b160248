"""The ``references:`` block of a hardware file: published numbers, each with its source, protocol and
tolerance.  Acceptance carries across hardware and is held to ``rel_tol``; a speed reference is shown
beside its source's hardware with no verdict (DESIGN.md: *A published reference*).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveFloat, model_validator

from .errors import ParamsError, validate
from .files import hardware_file, load_yaml


class SourceSpec(BaseModel):
    """Where the number is published: a repository file (at a commit) or a URL."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    repo: str | None = None
    file: str | None = None
    commit: str | None = None
    url: str | None = None

    @model_validator(mode="after")
    def _somewhere(self) -> SourceSpec:
        if not (self.url or (self.repo and self.file)):
            raise ValueError("a source needs repo and file, or url")
        return self

    def cite(self) -> str:
        at = f"@{self.commit[:12]}" if self.commit else ""
        return self.url or f"{self.repo}{at}:{self.file}"


class ReferenceSpec(BaseModel):
    """One published figure and the protocol it was measured under."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    name: str = Field(min_length=1)
    kind: Literal["acceptance", "speed"]
    model: str
    method: str
    framework: str | None = None
    sweep: str | None = None
    source: SourceSpec
    #: what a run must match to be comparable: prompts, max_new_tokens, temperature, gamma,
    #: chat_template, max_model_len, bos_token_id, hardware, ...
    protocol: dict[str, Any] = {}
    acceptance_length: PositiveFloat | None = None
    per_position: list[float] = []
    speedup: PositiveFloat | None = None
    rel_tol: PositiveFloat | None = None

    @model_validator(mode="after")
    def _figures(self) -> ReferenceSpec:
        if self.kind == "acceptance" and (self.acceptance_length is None or self.rel_tol is None):
            raise ValueError("an acceptance reference needs acceptance_length and rel_tol")
        if self.kind == "speed" and self.speedup is None:
            raise ValueError("a speed reference needs speedup (and protocol.hardware)")
        return self


def load_references(name: str) -> tuple[ReferenceSpec, ...]:
    """The references of ``params/hardware/<name>.yaml`` (none: an empty tuple)."""
    path = hardware_file(name)
    items = load_yaml(path).get("references") or []
    if not isinstance(items, list):
        raise ParamsError(path, "references", items, "a list of references (name, kind, source, protocol, ...)")
    return tuple(validate(ReferenceSpec, item, path, f"references[{i}].") for i, item in enumerate(items))
