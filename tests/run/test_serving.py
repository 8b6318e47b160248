"""Serving benchmark: arrival processes, bounded runs, goodput, paired sweep and the CLI.

Servers here are format fixtures (tests/fake_servers.py); their speeds are scripted, so the
speedups below test the arithmetic and plumbing, not any engine.
"""

import asyncio
import json
import math
import time

import numpy as np
import pytest
from fake_servers import FakeServer

from specstudy import metrics
from specstudy.analysis.serving import compare, stops_paying
from specstudy.backends import get_backend
from specstudy.cli import main
from specstudy.config.schema import Slo
from specstudy.layout import StudyLayout
from specstudy.records import Cell, Request, RequestRecord, Sampling
from specstudy.run.serving_driver import Load, SweepConfig, arrival_offsets, drive, parse_rates, run_sweep

CELL = Cell("serve-bench", "cpu", "vllm-server", "ngram", "adhoc", "m", gamma=4)
SAMPLING = Sampling(max_new_tokens=9)


def test_parse_rates():
    assert parse_rates("0.5, 1,inf") == [0.5, 1.0, math.inf]
    for bad in ("0", "-1", "fast", ""):
        with pytest.raises(ValueError, match="rate"):
            parse_rates(bad)


def test_poisson_and_gamma_arrivals():
    gaps = np.diff(arrival_offsets(4001, rate=4.0, burstiness=1.0, seed=1))
    assert gaps.mean() == pytest.approx(0.25, rel=0.06)
    assert (gaps.std() / gaps.mean()) ** 2 == pytest.approx(1.0, rel=0.1)  # exponential: CV² = 1
    bursty = np.diff(arrival_offsets(4001, rate=4.0, burstiness=0.25, seed=1))
    assert bursty.mean() == pytest.approx(0.25, rel=0.15)
    assert (bursty.std() / bursty.mean()) ** 2 == pytest.approx(4.0, rel=0.2)  # gamma shape b: CV² = 1/b
    assert arrival_offsets(3, math.inf) == [0.0, 0.0, 0.0]
    assert arrival_offsets(5, 2.0, seed=7) == arrival_offsets(5, 2.0, seed=7)
    assert arrival_offsets(5, 2.0)[0] == 0.0
    with pytest.raises(ValueError, match="burstiness"):
        arrival_offsets(3, 1.0, burstiness=0)


class _FakeSender:
    """A load-generator sender that sleeps instead of talking HTTP (counts requests in flight)."""

    def __init__(self, duration_s, fail=False):
        self.duration_s, self.fail = duration_s, fail
        self.in_flight = self.peak = 0

    def prepare_send(self, client, request, sampling, cell, timeout_s=None):
        return request, timeout_s

    async def transmit(self, client, prep, cell, origin=None, budget_s=None):
        request, timeout_s = prep
        timeout_s = min(timeout_s, budget_s) if budget_s is not None else timeout_s
        if self.fail:
            raise RuntimeError("client bug")
        sampling = SAMPLING
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        t0 = time.perf_counter()
        rec = cell.new_record(request, sampling, start_epoch=time.time(), output_tokens=5)
        rec.sent_s = t0 - origin if origin is not None else None
        try:
            await asyncio.wait_for(asyncio.sleep(self.duration_s), timeout_s)
            rec.first_token_s, rec.end_s = 0.01, self.duration_s
        except asyncio.TimeoutError:
            rec.status = "timeout"
        finally:
            self.in_flight -= 1
        return rec


def _reqs(n):
    return [Request(f"p{i}", "x") for i in range(n)]


def test_fixed_concurrency_caps_requests_in_flight():
    sender = _FakeSender(0.05)
    recs, wall = drive(
        sender,
        _reqs(8),
        SAMPLING,
        CELL,
        Load(math.inf, concurrency=2),
        request_timeout_s=5,
        run_timeout_s=30,
    )
    assert sender.peak == 2 and len(recs) == 8 and all(r.status == "ok" for r in recs)
    assert wall >= 4 * 0.05
    # a request that waited for a slot is due when the slot freed: its queueing is kept apart
    assert all(r.scheduled_send_s is not None and r.sent_s >= r.scheduled_send_s for r in recs)
    assert sum("queued_s" in r.extra for r in recs) == 6


def test_open_loop_rate_spreads_sends():
    recs, wall = drive(
        _FakeSender(0.0),
        _reqs(6),
        SAMPLING,
        CELL,
        Load(20.0),
        request_timeout_s=5,
        run_timeout_s=30,
        seed=3,
    )
    offsets = arrival_offsets(6, 20.0, seed=3)
    # every record carries its schedule and its actual send time, on the run's clock: none went out
    # before it was due, in the schedule's order, and the run lasted until the last was due (how close
    # to schedule the sends are is measured by bench/send_schedule.py against its 1 ms target)
    assert [r.scheduled_send_s for r in recs] == pytest.approx(offsets)
    assert all(r.sent_s is not None and r.sent_s >= r.scheduled_send_s for r in recs)
    sent = [r.sent_s for r in sorted(recs, key=lambda r: r.scheduled_send_s)]
    assert sent == sorted(sent) and wall >= offsets[-1]


def test_run_deadline_bounds_the_run_and_marks_unsent():
    t0 = time.monotonic()
    recs, wall = drive(
        _FakeSender(10.0),
        _reqs(5),
        SAMPLING,
        CELL,
        Load(math.inf, concurrency=1),
        request_timeout_s=60,
        run_timeout_s=0.5,
    )
    assert time.monotonic() - t0 < 3.0
    assert len(recs) == 5 and all(r.status == "timeout" for r in recs)
    assert sum("not sent" in r.error for r in recs) == 4


def _rec(status="ok", ttft=0.1, end=1.0, n=10, start=0.0, pid="a"):
    return RequestRecord(
        "s",
        "cpu",
        "f",
        "m",
        "t",
        pid,
        0,
        "c",
        "m",
        status=status,
        first_token_s=ttft,
        end_s=end,
        output_tokens=n,
        start_epoch=start,
    )


def test_goodput_and_request_throughput():
    recs = [
        _rec(ttft=0.1, end=1.0, start=0.0),
        _rec(ttft=0.5, end=1.0, start=1.0),  # TTFT too slow
        _rec(ttft=0.1, end=3.0, start=1.0),  # TPOT (3-0.1)/9 too slow
        _rec(status="timeout", start=2.0),
        _rec(ttft=0.1, end=0.1, n=1, start=3.0),
    ]  # one token: no TPOT
    assert metrics.request_throughput(recs) == pytest.approx(4 / 4.0)  # span 0 → 4.0 s
    assert metrics.goodput(recs, ttft_s=0.2, tpot_s=0.2) == pytest.approx(2 / 4.0)
    assert metrics.goodput(recs) == pytest.approx(4 / 4.0)
    assert metrics.goodput(recs, e2e_s=0.5) == pytest.approx(1 / 4.0)
    assert not metrics.meets_slo(_rec(ttft=None), ttft_s=1.0)  # unknown TTFT cannot meet an SLO
    assert math.isnan(metrics.request_throughput([_rec(status="error")]))


def test_stops_paying_marks_the_lowest_losing_rate():
    cs = [(math.inf, {"speedup": 0.8}), (0.5, {"speedup": 1.4}), (2.0, {"speedup": 0.97}), (1.0, {"speedup": 1.1})]
    assert stops_paying(cs) == 2.0
    assert stops_paying([(1.0, {"speedup": 1.2}), (2.0, {"speedup": float("nan")})]) is None


def test_compare_pairs_by_prompt():
    base = [_rec(pid="a", end=2.0), _rec(pid="b", end=4.0)]
    spec = [_rec(pid="b", end=2.0), _rec(pid="a", end=1.0), _rec(pid="c", end=0.1)]
    c = compare(base, spec)
    assert c["speedup"] == pytest.approx(6.0 / 3.0) and c["n_prompts"] == 2


def test_sweep_against_fixture_servers(tmp_path):
    with (
        FakeServer(mode="vllm", delay_s=0.002) as spec_srv,
        FakeServer(mode="vllm", spec=False, delay_s=0.01) as base_srv,
    ):
        backends = {
            "spec": get_backend("vllm-server", model="m", base_url=spec_srv.url, request_timeout_s=10),
            "baseline": get_backend("vllm-server", model="m", base_url=base_srv.url, request_timeout_s=10),
        }
        cfg = SweepConfig(
            spec_method="ngram",
            gamma=4,
            rates=[50.0, math.inf],
            warmup=1,
            request_timeout_s=10,
            run_timeout_s=60,
            slo=Slo(ttft_ms=5000, tpot_ms=1000),
        )
        summary = run_sweep(backends, _reqs(4), _reqs(1), SAMPLING, CELL, cfg, tmp_path, progress=lambda m: None)
    assert [r["arm"] for r in summary["runs"]] == ["baseline", "baseline", "spec", "spec"]
    for run in summary["runs"]:
        assert run["n_ok"] == 4 and run["warmup"] == {"n": 1, "n_ok": 1}
        assert run["goodput_rps"] > 0 and run["output_throughput_tps"] > 0
    spec_run = summary["runs"][2]
    acc = spec_run["run_acceptance"]
    # the warm-up request is outside the scrape window: counters equal the timed requests' sums
    assert acc["source"] == "server_counters"
    assert acc["drafted_tokens"] == acc["per_request_sum"]["drafted_tokens"]
    assert summary["runs"][0]["run_acceptance"] is None  # baseline: nothing to report
    assert len(summary["comparison"]) == 2 and all(c["n_prompts"] == 4 for c in summary["comparison"])
    saved = json.loads((tmp_path / "summary.json").read_text())  # strict JSON (no NaN)
    assert saved["config"]["rates"] == [50.0, "inf"]
    recs = StudyLayout(tmp_path).read_all()
    assert len(recs) == 16 and {r.method for r in recs} == {"ar", "ngram"}
    assert len({r.cell_id for r in recs}) == 4  # one part per (method, rate)


def test_cli_serve_bench_against_fixtures(tmp_path, capsys):
    with FakeServer(mode="vllm") as spec_srv, FakeServer(mode="vllm", spec=False) as base_srv:
        rc = main(
            [
                "serve-bench",
                "--backend",
                "vllm-server",
                "--model",
                "m",
                "--spec",
                "ngram",
                "--rates",
                "inf",
                "--num-requests",
                "2",
                "--warmup",
                "0",
                "--prompt",
                "a b c",
                "--prompt",
                "d e f",
                "--base-url",
                spec_srv.url,
                "--baseline-url",
                base_srv.url,
                "--max-new-tokens",
                "6",
                "--out",
                str(tmp_path),
                "--json",
            ]
        )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["comparison"][0]["n_prompts"] == 2 and (tmp_path / "summary.json").exists()


def test_cli_rejects_bad_values_before_starting(capsys):
    assert main(["serve-bench", "--model", "m", "--spec", "ngram", "--ngram-min", "5", "--ngram-max", "2"]) == 2
    assert "ngram-min" in capsys.readouterr().err
    assert main(["serve-bench", "--model", "m", "--spec", "ar"]) == 2
    assert main(["serve-bench", "--model", "m", "--spec", "ngram", "--num-requests", "0"]) == 2


def test_a_server_that_fails_to_start_is_reported_not_raised(tmp_path):
    import sys

    with FakeServer(mode="vllm", spec=False) as base_srv:
        broken = get_backend(
            "openai",
            model="m",
            command=[sys.executable, "-c", "raise SystemExit(4)"],
            log_dir=tmp_path / "logs",
            ready_timeout_s=30,
        )
        backends = {
            "spec": broken,
            "baseline": get_backend("vllm-server", model="m", base_url=base_srv.url, request_timeout_s=10),
        }
        cfg = SweepConfig(
            spec_method="ngram", gamma=4, rates=[math.inf], warmup=0, request_timeout_s=10, run_timeout_s=60
        )
        summary = run_sweep(backends, _reqs(2), [], SAMPLING, CELL, cfg, tmp_path, progress=lambda m: None)
    assert [r["arm"] for r in summary["runs"]] == ["baseline"]
    assert summary["errors"][0]["arm"] == "spec" and "code 4" in summary["errors"][0]["error"]
    assert summary["comparison"] == [] and summary["stops_paying_at_rate"] is None


def test_a_crashing_client_leaves_an_error_record():
    recs, _ = drive(
        _FakeSender(0.0, fail=True), _reqs(2), SAMPLING, CELL, Load(math.inf), request_timeout_s=5, run_timeout_s=10
    )
    assert [r.status for r in recs] == ["error", "error"] and "client bug" in recs[0].error
