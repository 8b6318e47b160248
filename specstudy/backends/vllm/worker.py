"""The offline vLLM worker: ``<vllm venv>/bin/python -m specstudy.backends.vllm.worker``.

Runs inside vLLM's own environment (its torch/transformers pins), builds ``vllm.LLM`` through
:class:`specstudy.backends.vllm.offline.VllmEngine` — the same code that builds records
in-process — and answers the JSON-lines protocol of :mod:`specstudy.backends.vllm.protocol` on the
stdout it had at start.  Everything else written to stdout (vLLM logs to stdout by default) is
sent to stderr, so it cannot corrupt the protocol.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, TextIO

from . import protocol

#: builds the engine from (model, drafter, options)
MakeEngine = Callable[[str, str | None, dict[str, Any]], Any]


def _claim_stdout() -> TextIO:
    """A private copy of stdout for the protocol; fd 1 (and child processes') goes to stderr."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return proto


def serve(inp: TextIO, out: TextIO, make_engine: MakeEngine) -> int:
    """Answer messages until ``close`` or end of input; returns the exit code."""

    def send(msg: dict[str, Any]) -> None:
        out.write(protocol.dumps(msg))
        out.flush()

    engine = None
    for line in inp:
        if not line.strip():
            continue
        try:
            msg = json.loads(line)
            op = msg.get("op")
        except ValueError as e:
            send({"op": "error", "kind": "bad_request", "message": f"not JSON: {e}"})
            continue
        try:
            if op == "init":
                engine = _init(msg, make_engine, send)
            elif op == "run":
                if engine is None:
                    raise ValueError("run before init")
                _run(engine, msg, send)
            elif op == "close":
                if engine is not None:
                    engine.close()
                send({"op": "closed"})
                return 0
            else:
                raise ValueError(f"op={op!r}: allowed init, run, close")
        except ValueError as e:
            send({"op": "error", "kind": "bad_request", "message": str(e)})
        except Exception as e:  # the engine failed: say what, with the traceback, and keep serving
            kind = "load" if op == "init" or type(e).__name__ == "BackendUnavailable" else "run"
            send(
                {
                    "op": "error",
                    "kind": kind,
                    "message": f"{type(e).__name__}: {e}"[:4000],
                    "traceback": traceback.format_exc()[-4000:],
                }
            )
    if engine is not None:
        engine.close()
    return 0


def _init(msg: dict[str, Any], make_engine: MakeEngine, send: Callable[[dict[str, Any]], None]) -> Any:
    engine = make_engine(msg["model"], msg.get("drafter"), dict(msg.get("options") or {}))
    send(
        {
            "op": "ready",
            "pid": os.getpid(),
            "engine_version": getattr(getattr(engine, "vllm", None), "__version__", None),
        }
    )
    return engine


def _run(engine: Any, msg: dict[str, Any], send: Callable[[dict[str, Any]], None]) -> None:
    cell = protocol.cell_from(msg["cell"])
    sampling = protocol.sampling_from(msg["sampling"])
    requests = [protocol.request_from(r) for r in msg["requests"]]
    for rec in engine.run(requests, sampling, cell):
        send({"op": "record", "record": rec})
    send({"op": "done", "run_acceptance": engine.last_run_acceptance})


def _vllm_engine(model: str, drafter: str | None, options: dict[str, Any]) -> Any:
    from .offline import VllmEngine  # runs inside vLLM's venv: imported only there, where vllm exists

    return VllmEngine(model, drafter, options)


def main() -> int:
    out = _claim_stdout()
    return serve(sys.stdin, out, _vllm_engine)


if __name__ == "__main__":
    sys.exit(main())
