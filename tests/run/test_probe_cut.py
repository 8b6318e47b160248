"""A capacity probe stops once its SLO verdict is decided, and the verdict stays what it would have been.

:func:`~specstudy.run.capacity_search.cut_rule` says how many requests past a limit break a percentile
whatever the rest do; the load generator (:class:`~specstudy.backends.loadgen.CutRule`) watches each
request's wait from its arrival and, once that many are past the limit, cancels what is in flight and
sends nothing more.  Checked here by simulation against the verdict's own code (``slo_holds``) and
against a stand-in server with two slots served over the real asyncio load generator.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass

import numpy as np
import pytest

from specstudy.analysis.capacity import probe_held
from specstudy.backends.loadgen import CutRule, Offer, offer
from specstudy.config.schema import Slo
from specstudy.records import Cell, Request, RequestRecord, Sampling
from specstudy.run.capacity_search import cut_rule

CELL = Cell("probe", "cpu", "openai", "ar", "code", "smollm2")
SAMPLING = Sampling()


def _records(ttfts) -> list[RequestRecord]:
    return [
        CELL.new_record(Request(f"p{i}", ""), SAMPLING, output_tokens=4, first_token_s=t, end_s=t + 0.1)
        for i, t in enumerate(ttfts)
    ]


@pytest.mark.parametrize("percentile", [50, 90, 99])
def test_the_cut_count_breaks_the_percentile_whatever_the_rest_do_and_one_fewer_does_not(percentile):
    """Simulated over sizes 3-40: ``count`` latencies past the limit break the verdict for any values of
    the others (drawn at random, and all zero); ``count - 1`` just past it, with the others at zero, hold
    it: the rule stops no probe that could still have held."""
    slo = Slo(ttft_ms=1000, tpot_ms=None, percentile=percentile)
    rng = np.random.default_rng(0)
    for n in range(3, 41):
        k = cut_rule(slo, n).count
        assert 1 <= k <= n
        for _ in range(20):
            late = list(1.0 + rng.exponential(2.0, k))
            rest = list(rng.uniform(0.0, 3.0, n - k))
            assert probe_held(_records(late + rest), slo) is False
            assert probe_held(_records(late + [0.0] * (n - k)), slo) is False
        # k - 1 known only to be past the limit may end just past it: then the verdict can still hold
        assert probe_held(_records([1.001] * (k - 1) + [0.0] * (n - k + 1)), slo) is True


def test_tpot_is_watched_only_where_every_request_decodes_a_known_count():
    tpot_only = Slo(ttft_ms=None, tpot_ms=250, percentile=90)
    assert cut_rule(tpot_only, 12) is None and cut_rule(tpot_only, 12, tokens=1) is None
    assert cut_rule(tpot_only, 24, tokens=32) == CutRule(4, None, 0.25, None, 32)
    assert cut_rule(Slo(ttft_ms=3000, tpot_ms=250, percentile=90), 12) == CutRule(3, 3.0)
    with pytest.raises(ValueError, match="count >= 1"):
        CutRule(0, 1.0)
    with pytest.raises(ValueError, match="TPOT limit"):
        CutRule(3, None, 0.25)  # no token count: TPOT is known only at each request's end


@dataclass
class _Prep:
    request: Request
    record: RequestRecord


class TwoSlots:
    """A server with two slots, each request ``service_s`` long (its first token 0.02 s into it, then
    ``tokens`` − 1 more evenly), FIFO, over asyncio: the load generator's real sender path, no process."""

    def __init__(self, service_s: float, tokens: int = 4):
        self.service_s, self.tokens, self.slots = service_s, tokens, None
        self.cancelled = 0

    def prepare_send(self, http, request, sampling, cell, timeout_s=None):
        return _Prep(request, cell.new_record(request, sampling))

    async def transmit(self, http, prep, cell, origin=None, budget_s=None):
        if self.slots is None:
            self.slots = asyncio.Semaphore(2)
        rec, t0 = prep.record, time.perf_counter()
        rec.start_epoch, rec.sent_s = time.time(), t0 - origin
        try:
            async with self.slots:
                await asyncio.sleep(0.02)
                rec.first_token_s = time.perf_counter() - t0
                await asyncio.sleep(self.service_s - 0.02)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        rec.end_s, rec.output_tokens = time.perf_counter() - t0, self.tokens
        return rec


def _run(rate: float, cut: CutRule | None, n: int = 12) -> tuple[list[RequestRecord], float, TwoSlots]:
    server = TwoSlots(0.2)
    offsets = [i / rate for i in range(n)]
    reqs = [Request(f"p{i}", "x") for i in range(n)]
    records, wall = offer(server, Offer(reqs, SAMPLING, CELL, offsets, None, 30.0, 60.0, cut))
    return records, wall, server


def test_an_overloaded_probe_is_cut_once_broken_and_reads_broken_as_its_full_run_does():
    """12 requests at 40 req/s against two slots of 0.2 s (10 req/s): the queue grows by about 0.07 s a
    request, and the third request whose wait passes 0.3 s decides p90.  The cut run stops well before the
    full one, its unfinished requests are ``cut`` (cancelled in flight, or never sent), and both read
    broken."""
    slo = Slo(ttft_ms=300, tpot_ms=None, percentile=90)
    rule = cut_rule(slo, 12)
    full, full_wall, _ = _run(40.0, None)
    cut, cut_wall, server = _run(40.0, rule)
    assert probe_held(full, slo) is False and probe_held(cut, slo) is False
    assert [r.prompt_id for r in cut] == [f"p{i}" for i in range(12)]
    statuses = [r.status for r in cut]
    assert "cut" in statuses and statuses.count("ok") < 12 and set(statuses) <= {"ok", "cut"}
    assert server.cancelled >= 1  # requests in flight were cancelled, not waited for
    assert cut_wall < 0.75 * full_wall, (cut_wall, full_wall)
    why = cut[0].extra["cut"]
    assert all(r.extra["cut"] == why for r in cut) and "3 requests past TTFT 0.3 s" in why
    late = [r.first_token_s for r in cut if r.status == "ok" and r.first_token_s > 0.3]
    in_flight = [r for r in cut if r.status == "cut" and r.sent_s is not None]
    assert len(late) + len(in_flight) >= 1 and all(r.scheduled_send_s is not None for r in cut)


def test_a_probe_that_holds_runs_to_its_end_untouched():
    """At 5 req/s the two slots keep up: nothing is late, nothing is cut, every request is ok."""
    slo = Slo(ttft_ms=300, tpot_ms=None, percentile=90)
    records, _, server = _run(5.0, cut_rule(slo, 12))
    assert [r.status for r in records] == ["ok"] * 12 and server.cancelled == 0
    assert not any("cut" in r.extra for r in records) and probe_held(records, slo) is True


def test_a_probe_decoding_too_slowly_is_cut_on_tpot_before_its_requests_end():
    """No queue (2 req/s against two slots) but each request decodes 8 tokens in 1.5 s (TPOT 0.21 s)
    against a TPOT limit of 0.1 s: a request in flight is past it once it has decoded 0.7 s, so the
    probe is cut on TPOT before its third request ends; its full run also reads broken."""
    slo = Slo(ttft_ms=None, tpot_ms=100, percentile=90)
    n = 6
    reqs = [Request(f"p{i}", "x") for i in range(n)]
    offsets = [i / 2 for i in range(n)]
    runs = {}
    for rule in (None, cut_rule(slo, n, tokens=8)):
        server = TwoSlots(1.5, tokens=8)
        runs[rule is not None] = offer(server, Offer(reqs, SAMPLING, CELL, offsets, None, 30.0, 60.0, rule))
    (full, full_wall), (cut, cut_wall) = runs[False], runs[True]
    assert probe_held(full, slo) is False and probe_held(cut, slo) is False
    assert "past TPOT 0.1 s" in cut[0].extra["cut"] and cut_wall < 0.7 * full_wall, (cut_wall, full_wall)


def test_requests_held_behind_a_full_client_cap_count_from_their_arrival():
    """A client cap of one slot at 40 req/s: requests wait at the client, not the server; their wait from
    arrival counts before they are sent, so the probe is cut while most were never sent."""
    server = TwoSlots(0.2)
    n = 12
    rule = CutRule(3, 0.3, None)
    reqs = [Request(f"p{i}", "x") for i in range(n)]
    records, wall = offer(server, Offer(reqs, SAMPLING, CELL, [i / 40 for i in range(n)], 1, 30.0, 60.0, rule))
    unsent = [r for r in records if r.status == "cut" and r.sent_s is None]
    assert unsent and wall < 1.5 and not math.isnan(wall)
    assert all(r.error.startswith("probe stopped at") for r in records if r.status == "cut")


@pytest.mark.slow
def test_a_real_llamacpp_probe_is_cut_and_its_server_drops_the_cut_requests(tmp_path):
    """The real thing: llama.cpp's server on the embedded SmolLM2, 12 requests of 32 tokens at 20 req/s
    (its two slots serve about 1 req/s) against p90 TTFT <= 1 s, two repeats in a capacity search.  Each
    probe is cut once broken; llama.cpp is still draining the cut requests a second later, so its server is
    stopped and the next probe starts a fresh one, warmed up again, on an idle server."""
    from support import LLAMACPP, write_study_file

    from specstudy.analysis.validity import assess
    from specstudy.config import load_study
    from specstudy.layout import StudyLayout
    from specstudy.run.plan import expand
    from specstudy.run.study_runner import run_study

    path = write_study_file(
        tmp_path,
        ["code"],
        **{**LLAMACPP, "methods": [{"method": "ar"}]},
        request_rates=[20],
        repeats=2,
        prompts_per_task=12,
        max_new_tokens=32,
        slo={"ttft_ms": 1000, "tpot_ms": None, "percentile": 90},
        sampling={"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": 0, "ignore_eos": True},
    )
    cfg = load_study("cpu", path)
    layout = StudyLayout(tmp_path / "out")
    plans = [p for p in expand(cfg) if p.request_rate]
    res = run_study(cfg, plans, layout, progress=False, log=lambda m: None, capacity_search=True)
    assert [r.status for r in res] == ["done", "done"], res
    slo = Slo(ttft_ms=1000, tpot_ms=None, percentile=90)
    for p, r in zip(plans, res):
        recs = layout.read_part(p.cell_id)
        statuses = [r.status for r in recs]
        assert len(recs) == 12 and "cut" in statuses and probe_held(recs, slo) is False, statuses
        # llama.cpp drains its deferred requests one prefill at a time: stopped after 1 s, started afresh
        assert "past TTFT 1 s" in r.note and "server stopped" in r.note, r.note
        assert all(r.extra["warmup_ran_for_cell"] for r in recs)  # the fresh server was warmed up again
        assert not any((r.extra.get("server_at_start") or {}).get("waiting") for r in recs)
    findings = assess({p.cell_id: layout.read_part(p.cell_id) for p in plans})
    assert not [f for f in findings if f.check == "server not idle"], findings
