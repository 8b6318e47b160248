"""Server lifecycle and HTTP helpers, against dummy subprocesses and format fixtures (no engine)."""

import os
import sys
import time
from pathlib import Path

import pytest
from fake_servers import FakeServer

from specstudy.backends.lifecycle import ManagedServer, ServerStartError, connect, free_port, http_get, split_url
from specstudy.backends.prometheus import metric_by_label, metric_total, parse_prometheus

PROM = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 3.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
process_cpu_seconds_total 1.5
weird_label{path="a\\"b"} 2
"""


def test_parse_prometheus_sums_labels_and_skips_comments():
    s = parse_prometheus(PROM)
    assert metric_total(s, "vllm:spec_decode_num_drafts_total") == 15.0
    assert metric_total(s, "vllm:spec_decode_num_draft_tokens_total") is None  # absent, not 0
    assert metric_by_label(s, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "position") == {"0": 10.0, "1": 4.0}
    assert metric_total(s, "process_cpu_seconds_total") == 1.5
    assert s["weird_label"][0][0]["path"] == 'a"b'


def test_free_port_and_url_checks():
    p = free_port()
    assert 1024 <= p <= 65535
    assert split_url("http://127.0.0.1:8000/x/") == ("127.0.0.1", 8000, "/x")
    with pytest.raises(ValueError, match="https"):
        split_url("https://example.com")


def _http_server_argv(tmp_path: Path) -> list[str]:
    """A dummy 'inference server': python's http.server serving a file named health."""
    (tmp_path / "www").mkdir()
    (tmp_path / "www" / "health").write_text("ok")
    return [sys.executable, "-m", "http.server", "{port}", "--bind", "{host}", "--directory", str(tmp_path / "www")]


def test_managed_server_ready_log_and_stop(tmp_path):
    srv = ManagedServer(
        _http_server_argv(tmp_path),
        log_path=tmp_path / "logs" / "s.log",
        ready_timeout_s=30,
        env={"SPECSTUDY_FIXTURE": "1"},
        poll_s=0.1,
    )
    info = srv.start()
    pid = info.pid
    try:
        assert srv.running() and info.started_by_kit and info.ready_s is not None
        assert str(srv.port) in info.command and "http.server" in info.command  # exact command, port filled
        assert info.env == {"SPECSTUDY_FIXTURE": "1"}
        assert http_get(srv.url + "/health")[0] == 200
    finally:
        srv.stop()
    assert not srv.running()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    log = (tmp_path / "logs" / "s.log").read_text()
    assert "# specstudy:" in log and "GET /health" in log  # the server's own log was captured
    srv.stop()  # idempotent


def _proc_env(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(x.decode().split("=", 1) for x in raw if b"=" in x)


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc/<pid>/environ")
@pytest.mark.parametrize("explicit", [{}, {"OMP_WAIT_POLICY": "ACTIVE"}])
def test_a_started_engine_keeps_its_own_threading_default(tmp_path, monkeypatch, explicit):
    """The kit's PASSIVE OpenMP policy (for its in-process engines) does not leak into a server it
    starts; a policy the study sets for that engine does reach it."""
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.setenv("SPECSTUDY_INHERITED", "yes")
    srv = ManagedServer(_http_server_argv(tmp_path), log_path=tmp_path / "s.log", ready_timeout_s=30, env=explicit)
    info = srv.start()
    try:
        env = _proc_env(info.pid)
    finally:
        srv.stop()
    assert env.get("OMP_WAIT_POLICY") == explicit.get("OMP_WAIT_POLICY") and env["SPECSTUDY_INHERITED"] == "yes"


def test_server_that_exits_reports_code_and_log_tail(tmp_path):
    argv = [sys.executable, "-c", "import sys; print('fixture: cannot load model', flush=True); sys.exit(3)"]
    with pytest.raises(ServerStartError, match="code 3") as e:
        ManagedServer(argv, log_path=tmp_path / "x.log", ready_timeout_s=30, poll_s=0.1).start()
    assert "cannot load model" in str(e.value)


def test_server_not_ready_in_time_is_killed(tmp_path):
    argv = [sys.executable, "-c", "import time; print('loading...', flush=True); time.sleep(120)"]
    srv = ManagedServer(argv, log_path=tmp_path / "x.log", ready_timeout_s=1.0, poll_s=0.1, stop_timeout_s=5)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match="not ready after"):
        srv.start()
    assert time.monotonic() - t0 < 15
    assert srv.proc is None  # stopped, nothing left running


def test_context_manager_stops_on_error(tmp_path):
    srv = ManagedServer(_http_server_argv(tmp_path), log_path=tmp_path / "s.log", ready_timeout_s=30, poll_s=0.1)
    with pytest.raises(KeyboardInterrupt):
        with srv:
            pid = srv.proc.pid
            raise KeyboardInterrupt  # Ctrl-C during a run
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_missing_binary_is_a_clear_error(tmp_path):
    with pytest.raises(ServerStartError, match="cannot launch"):
        ManagedServer(["/nonexistent/llama-server", "--port", "{port}"], log_path=tmp_path / "x.log").start()


def test_connect_checks_health_and_reads_version():
    with FakeServer() as fake:
        info = connect(fake.url, version=lambda url: http_get(url + "/version")[1])
        assert not info.started_by_kit and info.command is None and "0.32.0-fake" in info.version
    with pytest.raises(ServerStartError, match="does not answer"):
        connect(f"http://127.0.0.1:{free_port()}", timeout_s=2)
