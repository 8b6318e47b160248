"""One error for every bad parameter: the file, the key path, the bad value and what is allowed.

The schemas are pydantic models; :func:`from_validation_error` turns pydantic's first error into
a :class:`ParamsError` with the same four parts the kit has always printed, so a user reads
``p.yaml: study.models[0].dtype='fp12' is not allowed; allowed: ['float32', ...]`` and never a
pydantic traceback.  Validators that know the allowed values raise :func:`not_allowed`.
Checks that can find several problems at once (the task files of a study) collect them into one
:class:`ParamsProblems`, one problem a line, so a user fixes them all before the next try.
"""

from __future__ import annotations

import os
import types
import typing
from collections.abc import Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails, PydanticCustomError

M = TypeVar("M", bound=BaseModel)


class ParamsError(ValueError):
    """A bad parameter: names file, key, value and the allowed values."""

    def __init__(self, file: str | os.PathLike[str] | None, key: str, value: Any, allowed: Any, hint: str = ""):
        self.file, self.key, self.value, self.allowed, self.hint = file, key, value, allowed, hint
        where = f"{file}: " if file else ""
        msg = f"{where}{key}={value!r} is not allowed; allowed: {allowed}"
        if hint:
            msg += f" ({hint})"
        super().__init__(msg)


class ParamsProblems(ParamsError):
    """Several bad parameters found by one check, listed one a line (the first one's parts as attributes).

    A subclass of :class:`ParamsError`, so whoever catches a bad parameter catches these too.
    """

    def __init__(self, problems: Sequence[ParamsError], what: str = "parameters"):
        if not problems:
            raise ValueError("ParamsProblems needs at least one problem")
        self.problems = list(problems)
        first = self.problems[0]
        self.file, self.key, self.value, self.allowed, self.hint = (
            first.file,
            first.key,
            first.value,
            first.allowed,
            first.hint,
        )
        n = len(self.problems)
        head = f"{n} problem{'s' if n > 1 else ''} in the {what}:"
        ValueError.__init__(self, "\n".join([head, *(f"  - {p}" for p in self.problems)]))


def not_allowed(value: Any, allowed: Any, hint: str = "", at: str | tuple[str | int, ...] = ()) -> PydanticCustomError:
    """An error for a validator to raise: pydantic keeps the location (``at`` goes below it, for a
    model validator that checks one of its keys), we keep the value and the allowed values."""
    at = tuple(at.split(".")) if isinstance(at, str) else tuple(at)
    return PydanticCustomError(
        "not_allowed",
        "{value!r} is not allowed; allowed: {allowed}",
        {"value": value, "allowed": allowed, "hint": hint, "at": at},
    )


_TYPE_WORDS = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "tuple_type": "a list",
    "missing": "a value (required)",
    "string_too_short": "a non-empty string",
    "too_short": "a non-empty list",
    "finite_number": "a finite number",
}


def key_path(prefix: str, loc: Sequence[str | int]) -> str:
    """``("models", 0, "dtype")`` under ``study.`` → ``study.models[0].dtype``."""
    out = prefix.rstrip(".")
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _unwrap(tp: Any) -> list[Any]:
    """The candidate types inside Optional/Union/Annotated."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [t for a in typing.get_args(tp) for t in _unwrap(a) if t is not type(None)]
    return [tp]


def _annotation_at(model: type[BaseModel], loc: Sequence[str | int]) -> Any:
    """The annotation a location points at inside ``model`` (None when the path leaves the schema)."""
    tp: Any = model
    for part in loc:
        nxt = None
        for cand in _unwrap(tp):
            if isinstance(cand, type) and issubclass(cand, BaseModel) and isinstance(part, str):
                field = cand.model_fields.get(part)
                nxt = field.annotation if field is not None else None
            elif typing.get_origin(cand) in (list, tuple, set, frozenset):
                args = typing.get_args(cand)
                nxt = args[0] if args else None
            elif typing.get_origin(cand) is dict:
                args = typing.get_args(cand)
                nxt = args[1] if len(args) == 2 else None
            if nxt is not None:
                break
        if nxt is None:
            return None
        tp = nxt
    return tp


def _allowed_for(model: type[BaseModel], err: ErrorDetails) -> Any:
    kind, loc, ctx = err["type"], tuple(err["loc"]), err.get("ctx") or {}
    if kind == "not_allowed":
        return ctx.get("allowed")
    if kind == "extra_forbidden":
        inner = _annotation_at(model, loc[:-1])
        for cand in _unwrap(inner) if inner is not None else []:
            if isinstance(cand, type) and issubclass(cand, BaseModel):
                return sorted(n for n, f in cand.model_fields.items() if f.description != "internal")
        return "known keys"
    if kind == "literal_error":
        ann = _annotation_at(model, loc)
        for cand in _unwrap(ann) if ann is not None else []:
            if typing.get_origin(cand) is typing.Literal:
                return list(typing.get_args(cand))
        return ctx.get("expected")
    if kind in ("greater_than", "greater_than_equal", "less_than", "less_than_equal"):
        op = {"greater_than": ">", "greater_than_equal": ">=", "less_than": "<", "less_than_equal": "<="}[kind]
        bound = next(iter(ctx.values()))
        return "positive values" if (op == ">" and bound == 0) else f"values {op} {bound}"
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error") or err["msg"]).removeprefix("Value error, ")
    return _TYPE_WORDS.get(kind, err["msg"])


def from_validation_error(
    exc: ValidationError, model: type[BaseModel], file: str | os.PathLike[str] | None, prefix: str = ""
) -> ParamsError:
    """The first error of ``exc`` as a :class:`ParamsError` (unknown keys: the key is the value)."""
    return _from_details(exc.errors(include_url=False)[0], model, file, prefix)


def from_validation_errors(
    exc: ValidationError, model: type[BaseModel], file: str | os.PathLike[str] | None, prefix: str = ""
) -> list[ParamsError]:
    """Every error of ``exc`` as a :class:`ParamsError`, the first one of each key path."""
    out: dict[str, ParamsError] = {}
    for err in exc.errors(include_url=False):
        pe = _from_details(err, model, file, prefix)
        out.setdefault(pe.key, pe)
    return list(out.values())


def _from_details(
    err: ErrorDetails, model: type[BaseModel], file: str | os.PathLike[str] | None, prefix: str
) -> ParamsError:
    loc = tuple(err["loc"]) + tuple((err.get("ctx") or {}).get("at") or ())
    allowed = _allowed_for(model, err)
    hint = (err.get("ctx") or {}).get("hint", "")
    if err["type"] == "extra_forbidden":
        return ParamsError(file, key_path(prefix, loc), loc[-1], allowed, "unknown key")
    value = (err.get("ctx") or {}).get("value", err.get("input")) if err["type"] == "not_allowed" else err.get("input")
    if err["type"] == "missing":
        value = None
    return ParamsError(file, key_path(prefix, loc), value, allowed, hint)


def validate(model: type[M], data: Any, file: str | os.PathLike[str] | None, prefix: str = "") -> M:
    """``model.model_validate(data)``, failing with a :class:`ParamsError`."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise from_validation_error(e, model, file, prefix) from None


def validate_all(
    model: type[M], data: Any, file: str | os.PathLike[str] | None, prefix: str = ""
) -> tuple[M | None, list[ParamsError]]:
    """``model.model_validate(data)``, or None and every problem pydantic found (a check that lists them all)."""
    try:
        return model.model_validate(data), []
    except ValidationError as e:
        return None, from_validation_errors(e, model, file, prefix)
