"""The kit-started llama.cpp server (xllamacpp) through the serving path (``make test-engines``):
a request-rate run with its own gauges, the server tree's memory, the send schedule, and its
prompt cache read from its own timings."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.engines


def test_rate_run_gauges_memory_schedule_and_prompt_cache(tmp_path):
    from specstudy.backends.llamacpp.llamacpp_backend import LlamaCppBackend
    from specstudy.data.model_files import load_tokenizer
    from specstudy.data.tasks import load_requests
    from specstudy.records import Cell, Sampling
    from specstudy.run.serving_driver import Load, serve

    reqs = load_requests("chat_shared_prefix", 4, 0, load_tokenizer("smollm2-135m"))
    out = {}
    for cache in (False, True):
        b = LlamaCppBackend("smollm2-135m", threads=2, prefix_cache=cache, log_dir=tmp_path)
        b.gauge_period_s = 0.1
        cell = Cell("t", "cpu", "llamacpp", "ngram", "chat_shared_prefix", "smollm2-135m", gamma=4, batch_size=2)
        try:
            run = serve(
                b,
                reqs,
                [],
                Sampling(max_new_tokens=16),
                Sampling(max_new_tokens=4),
                cell,
                Load(math.inf),
                request_timeout_s=120,
                run_timeout_s=600,
                telemetry_period_s=0.5,
            )
        finally:
            b.close()
        recs = run.records
        assert all(r.status == "ok" for r in recs), [r.error for r in recs]
        watch = recs[0].extra["server_watch"]
        assert watch["gauges"]["running"]["n"] > 0 and 0 < watch["gauges"]["running"]["max"] <= 2  # 2 slots
        assert all(r.memory_source == "server_rss" and r.peak_memory_bytes > 50e6 for r in recs)
        lag = [r.sent_s - r.scheduled_send_s for r in recs]
        assert all(x >= 0 for x in lag)
        out[cache] = recs[0].extra["prefix_cache_counters"]
    assert out[False]["hits"] == 0 and out[True]["hits"] > 0  # cache_prompt reuses a slot's shared prefix
    print(out)
