"""The wire format between the kit and an engine worker process: one JSON object per line.

The client writes requests to the worker's stdin; the worker answers on its stdout, which it
keeps for this protocol alone (the engine's own logging goes to stderr).  Every message is a
dict with ``op``:

client → worker                                 worker → client
``{"op": "init", "model", "drafter", "options"}``  ``{"op": "ready", "pid", "engine_version"}``
``{"op": "run", "cell", "sampling", "requests"}``  ``{"op": "record", "record"}`` per request, then
                                                 ``{"op": "done", "run_acceptance"}``
``{"op": "close"}``                               ``{"op": "closed"}``, then the process exits
any failure                                      ``{"op": "error", "kind", "message", "traceback"}``

One ``run`` is in flight at a time: the client waits for its ``done`` before the next.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ...records import Cell, Request, RequestRecord, Sampling, StepRecord

#: error kinds: "load" (the engine could not be built: BackendUnavailable), "bad_request", "run"
ERROR_KINDS = ("load", "bad_request", "run")


def dumps(msg: dict[str, Any]) -> str:
    return json.dumps(msg, default=_default, allow_nan=True) + "\n"


def _default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)


def _tuples(value: Any) -> Any:
    """JSON lists back to tuples, so a decoded Cell stays hashable and equal to the original."""
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def cell_from(d: dict[str, Any]) -> Cell:
    return Cell(**{**d, "options": tuple((k, _tuples(v)) for k, v in d.get("options", ()))})


def request_from(d: dict[str, Any]) -> Request:
    ids = d.get("prompt_ids")
    msgs = d.get("messages")
    return Request(
        **{
            **d,
            "prompt_ids": tuple(ids) if ids is not None else None,
            "messages": tuple(tuple(m) for m in msgs) if msgs is not None else None,
        }
    )


def sampling_from(d: dict[str, Any]) -> Sampling:
    return Sampling(**d)


def record_from(d: dict[str, Any]) -> RequestRecord:
    return RequestRecord(**{**d, "steps": [StepRecord(**s) for s in d.get("steps") or []]})


def request_message(request: Request) -> dict[str, Any]:
    """A request's :class:`Request` fields only: a subclass's extras (a task prompt's input policy,
    source, reference) stay with the runner, which writes them into the records itself."""
    return {f.name: getattr(request, f.name) for f in dataclasses.fields(Request)}


def run_message(requests: list[Request], sampling: Sampling, cell: Cell) -> dict[str, Any]:
    return {
        "op": "run",
        "cell": dataclasses.asdict(cell),
        "sampling": dataclasses.asdict(sampling),
        "requests": [request_message(r) for r in requests],
    }
