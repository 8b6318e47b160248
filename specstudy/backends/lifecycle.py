"""Inference-server lifecycle: start, wait for readiness, log, stop; or attach to a running one.

A measured server must be reproducible and must never outlive the run: :class:`ManagedServer`
starts it with the configured flags on a free loopback port, waits for readiness with a
timeout, captures its log into a file, records the exact command line and version, and stops
its whole process group at the end, on error, on Ctrl-C and at interpreter exit.  A server
someone else runs is attached with :func:`connect` (the kit then records that it did not start
it).
"""

from __future__ import annotations

import atexit
import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO


class ServerStartError(RuntimeError):
    """The server exited or did not become ready in time; the message holds its log tail."""


#: the kit's threading policy for its in-process engines (the Makefile and ``specstudy run`` set
#: OMP_WAIT_POLICY=PASSIVE for torch on shared cores).  An engine in its own process keeps its own
#: default unless its framework options' ``env`` sets it: inherited, PASSIVE slowed llama.cpp's
#: OpenMP decode on 2 cores from 16.4 to 24.6 ms/token (side by side, same server and prompt).
KIT_ONLY_ENV = ("OMP_WAIT_POLICY",)


def engine_process_env(explicit: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of an engine process the kit starts: the kit's own, less its in-process
    tuning (:data:`KIT_ONLY_ENV`), plus the variables the study sets for that engine."""
    env = {k: v for k, v in os.environ.items() if k not in KIT_ONLY_ENV}
    env.update(explicit or {})
    return env


# --------------------------------------------------------------------------------------------
# HTTP helpers (stdlib only: no client library to pin)


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free right now on ``host`` (bind to 0, read it, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def split_url(url: str) -> tuple[str, int, str]:
    """(host, port, base path) of an ``http://host:port/base`` URL; only plain http is allowed."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"base_url={url!r}: expected http://HOST:PORT (https is not supported)")
    return parts.hostname, parts.port or 80, parts.path.rstrip("/")


def http_get(url: str, timeout_s: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; raises OSError on connection failure or timeout."""
    return http_request("GET", url, timeout_s)


def http_request(method: str, url: str, timeout_s: float = 5.0, json_body: Any = None) -> tuple[int, str]:
    """(status, body) of one request (``json_body`` sent as JSON); raises OSError on connection failure."""
    host, port, path = split_url(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        if json_body is None:
            conn.request(method, path or "/")
        else:
            body = json.dumps(json_body).encode()
            conn.request(method, path or "/", body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", errors="replace")
    finally:
        conn.close()


# --------------------------------------------------------------------------------------------
# lifecycle


@dataclass
class ServerInfo:
    """What the records say about the server: how it was started, which build, where its log is."""

    url: str
    started_by_kit: bool
    command: str | None = None  # exact command line (shell-quoted) when the kit started it
    version: str | None = None
    log_path: str | None = None
    ready_s: float | None = None  # seconds from launch to the first healthy answer
    pid: int | None = None
    env: dict[str, str] = field(default_factory=dict)  # the variables the kit set for it

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def connect(
    url: str, health_path: str = "/health", timeout_s: float = 10.0, version: Callable[[str], str | None] | None = None
) -> ServerInfo:
    """Attach to a running server; fails fast (ServerStartError) if it does not answer healthy."""
    url = url.rstrip("/")
    split_url(url)
    try:
        status, body = http_get(url + health_path, timeout_s)
    except OSError as e:
        raise ServerStartError(f"server at {url} does not answer {health_path}: {e}") from e
    if status != 200:
        raise ServerStartError(f"server at {url} answered {health_path} with HTTP {status}: {body[:200]}")
    return ServerInfo(url=url, started_by_kit=False, version=_probe_version(version, url))


def _probe_version(probe: Callable[[str], str | None] | None, url: str) -> str | None:
    if probe is None:
        return None
    try:
        return probe(url)
    except Exception:  # a version probe must never fail a run
        return None


class ManagedServer:
    """One server process owned by the kit.

    ``argv`` may contain ``{port}`` and ``{host}`` placeholders, filled with a free loopback port.
    The process runs in its own session so the whole tree (engine workers included) is stopped
    with one signal to its process group.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        log_path: str | os.PathLike[str],
        env: Mapping[str, str] | None = None,
        health_path: str = "/health",
        ready_timeout_s: float = 900.0,
        stop_timeout_s: float = 30.0,
        host: str = "127.0.0.1",
        port: int | None = None,
        version: Callable[[str], str | None] | None = None,
        poll_s: float = 0.5,
    ):
        if not argv:
            raise ValueError("argv is empty: nothing to start")
        if ready_timeout_s <= 0:
            raise ValueError(f"ready_timeout_s={ready_timeout_s!r}: must be > 0")
        self.argv_template = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.health_path = health_path
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.host = host
        self.port = port
        self.version_probe = version
        self.poll_s = poll_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.info: ServerInfo | None = None
        self._log_file: BinaryIO | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> ServerInfo:
        """Launch, wait until ``health_path`` answers 200; on failure stop it and raise with the log tail."""
        if self.proc is not None:
            raise RuntimeError("server already started")
        if self.port is None:
            self.port = free_port(self.host)
        argv = [a.replace("{port}", str(self.port)).replace("{host}", self.host) for a in self.argv_template]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab", buffering=0)
        self._log_file.write(f"# specstudy: {shlex.join(argv)}\n".encode())
        t0 = time.monotonic()
        try:
            self.proc = subprocess.Popen(
                argv,
                stdout=self._log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=engine_process_env(self.env),
                start_new_session=True,
            )
        except OSError as e:
            self._close_log()
            raise ServerStartError(f"cannot launch {argv[0]!r}: {e}") from e
        atexit.register(self.stop)
        self.info = ServerInfo(
            url=self.url,
            started_by_kit=True,
            command=shlex.join(argv),
            log_path=str(self.log_path),
            pid=self.proc.pid,
            env=dict(self.env),
        )
        try:
            self._wait_ready(t0)
        except BaseException:
            self.stop()
            raise
        self.info.ready_s = time.monotonic() - t0
        self.info.version = _probe_version(self.version_probe, self.url)
        return self.info

    def _wait_ready(self, t0: float) -> None:
        assert self.proc is not None
        deadline = t0 + self.ready_timeout_s
        last = ""
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"server exited with code {code} before it was ready; command: "
                    f"{self.info.command if self.info else shlex.join(self.argv_template)}; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            try:
                status, _ = http_get(self.url + self.health_path, timeout_s=min(5.0, self.ready_timeout_s))
                if status == 200:
                    return
                last = f"HTTP {status}"
            except OSError as e:
                last = str(e)
            if time.monotonic() >= deadline:
                raise ServerStartError(
                    f"server not ready after {self.ready_timeout_s:.0f} s (ready_timeout_s; last health answer: "
                    f"{last}); command: {self.info.command if self.info else shlex.join(self.argv_template)}; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            time.sleep(self.poll_s)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n_lines: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n_lines:])

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after ``stop_timeout_s``; idempotent."""
        proc, self.proc = self.proc, None
        atexit.unregister(self.stop)
        if proc is not None and proc.poll() is None:
            self._signal_group(proc, signal.SIGTERM)
            try:
                proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self._signal_group(proc, signal.SIGKILL)
                proc.wait(10)
        self._close_log()

    @staticmethod
    def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
        try:
            os.killpg(proc.pid, sig)  # our own child's group: start_new_session made pgid == pid
        except ProcessLookupError:
            pass

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def __enter__(self) -> ManagedServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
