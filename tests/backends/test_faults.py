"""Faults of a server the kit started, with fixture servers (no engine): one that dies mid-cell, one
that never becomes ready.  What must hold: no hang, no lost rows, errors that name what happened."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from specstudy.backends.lifecycle import ManagedServer, ServerStartError
from specstudy.backends.openai.openai_server import OpenAIBackend
from specstudy.backends.server_base import ServerDied
from specstudy.records import Cell, Request, Sampling

FAKE = str(Path(__file__).resolve().parents[1] / "fake_servers.py")
SAMPLING = Sampling(max_new_tokens=6)


def _cell(batch: int = 1) -> Cell:
    return Cell("t", "cpu", "openai", "ar", "adhoc", "m", batch_size=batch)


def _reqs(n: int) -> list[Request]:
    return [Request(f"p{i}", "x", prompt_ids=(1, 2, 3)) for i in range(n)]


def test_a_server_that_dies_mid_cell_turns_unfinished_requests_into_error_rows_with_its_log(tmp_path):
    backend = OpenAIBackend(
        "m",
        command=[sys.executable, FAKE, "--port", "{port}", "--mode", "vllm", "--no-spec", "--die-after", "2"],
        log_dir=tmp_path / "servers",
        ready_timeout_s=30,
        request_timeout_s=10,
    )
    t0 = time.monotonic()
    with pytest.raises(ServerDied) as err:
        list(backend.run(_reqs(5), SAMPLING, _cell()))
    assert time.monotonic() - t0 < 20  # no request waits out its deadline on a dead server
    recs = err.value.records
    assert [r.prompt_id for r in recs] == [f"p{i}" for i in range(5)]  # every row kept, in order
    assert [r.status for r in recs] == ["ok", "ok", "error", "error", "error"]
    for r in recs[2:]:
        assert "server exited with code 7" in r.error and "fixture: engine crashed on request 3" in r.error
        assert str(tmp_path / "servers") in r.error  # the log file is named
    assert backend.server is None  # the next cell starts a new server
    backend.close()


def test_a_server_that_never_becomes_ready_names_its_command_and_log_within_the_timeout(tmp_path):
    argv = [sys.executable, "-c", "import time; print('loading weights...', flush=True); time.sleep(120)"]
    srv = ManagedServer(argv, log_path=tmp_path / "never.log", ready_timeout_s=1.5, poll_s=0.1, stop_timeout_s=5)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as err:
        srv.start()
    assert time.monotonic() - t0 < 1.5 + 10  # the stated timeout, plus stopping the process
    msg = str(err.value)
    assert "not ready after 2 s" in msg and "ready_timeout_s" in msg
    assert "command: " in msg and "time.sleep(120)" in msg  # the exact command line
    assert str(tmp_path / "never.log") in msg and "loading weights..." in msg  # the log file and its tail
    assert srv.proc is None
