"""Each validity check on a planted artifact (caught) and on a clean cell (passes)."""

from __future__ import annotations

import random

import pytest

from specstudy.analysis import validity as V
from specstudy.records import Cell, Request, Sampling
from specstudy.report.validity_text import finding_text

pytestmark = pytest.mark.validity


def _rec(pid, tpot_s, tokens=24, *, cell="c", method="ar", forwards_ms=None, rate=None, **extra):
    c = Cell("s", "cpu", "llamacpp", method, "code", "m", gamma=None if method == "ar" else 4, id=cell)
    r = c.new_record(Request(pid, "x"), Sampling(), output_tokens=tokens, first_token_s=0.05)
    r.end_s = 0.05 + tpot_s * (tokens - 1)
    r.chunk_times_s = [0.05 + tpot_s * i for i in range(tokens)]
    r.request_rate = rate
    r.extra = dict(extra)
    if forwards_ms is not None:
        r.extra["llamacpp_forward_ms"] = forwards_ms
    return r


def _clean(n=8, cell="c", **kw):
    """A quiet cell: every request within 1.15x of the median (as measured on the quiet machine)."""
    return [_rec(f"p{i}", 0.009 * (1 + 0.15 * (i % 2)), cell=cell, forwards_ms=[9.0] * 22, **kw) for i in range(n)]


def test_a_starved_first_request_is_an_outlier_and_its_cause_is_the_engine():
    recs = _clean()
    recs[0] = _rec("p0", 0.260, forwards_ms=[58, 112, 832, 2131, 733, 1132] + [9.0] * 16)  # the record
    found = V.stalls(recs)
    assert [f.requests for f in found] == [("p0",)] and all(f.flags for f in found)
    assert "engine starved" in finding_text(found[0]) and "2,131 ms" in finding_text(found[0])


def test_a_slow_request_whose_engine_forwards_were_normal_is_read_as_the_client():
    recs = _clean()
    recs[3] = _rec("p3", 0.050, forwards_ms=[9.0] * 22)
    (f,) = V.stalls(recs)
    assert f.requests == ("p3",) and "client or transport" in finding_text(f)


def test_one_long_gap_inside_an_otherwise_normal_request_is_an_outlier():
    recs = _clean()
    r = recs[5]
    r.chunk_times_s = [t + (1.0 if i >= 10 else 0.0) for i, t in enumerate(r.chunk_times_s)]  # a 1 s pause
    r.end_s = r.chunk_times_s[-1]
    assert [f.requests for f in V.stalls(recs)] == [("p5",)]


def test_a_clean_cell_has_no_outlier():
    assert V.stalls(_clean()) == []


def test_a_speculative_request_that_accepted_little_is_not_a_stall():
    """Its TPOT is 4x the median but each forward took as long as the others' (16 ms): no stall."""

    def spec(pid, tokens_per_forward, forward_s=0.016, slow_forwards=0):
        r = _rec(pid, forward_s / tokens_per_forward, method="ngram")
        n = round(23 / tokens_per_forward)
        r.chunk_times_s = [
            0.05 + forward_s * i + (0.2 if slow_forwards and i >= n - slow_forwards else 0) for i in range(n + 1)
        ]
        r.end_s, r.target_forwards = r.chunk_times_s[-1], n + 1
        return r

    recs = [spec(f"p{i}", 4) for i in range(6)] + [spec("low", 1)]
    assert V.stalls(recs) == []
    recs[-1] = spec("low", 1, slow_forwards=2)  # two forwards 0.2 s late
    assert [f.requests for f in V.stalls(recs)] == [("low",)]


def test_a_gap_filled_by_another_requests_prefill_in_the_batch_is_not_a_stall():
    """Batch 2 as llama.cpp runs it (make study-deploy, 2026-12-05): a request entering the batch has its
    whole prompt prefilled in the forward that also decodes its partner, whose gap then reads 16-26x
    the median on every rerun.  That gap is explained; the same pause with no first token in it is not."""

    def pair(pause_s, partner_starts_at_pause):
        recs = []
        for i in range(8):
            r = _rec(f"p{i}", 0.012, forwards_ms=[12.0] * 22)
            r.batch_size, r.start_epoch = 2, 1000.0 + 10.0 * i  # the others far apart
            recs.append(r)
        r = recs[0]
        r.chunk_times_s = [t + (pause_s if i >= 10 else 0.0) for i, t in enumerate(r.chunk_times_s)]
        r.end_s = r.chunk_times_s[-1]
        q = recs[1]  # its partner, sent during r's pause, first token at the pause's end
        start = r.start_epoch + r.chunk_times_s[9] + (0.0 if partner_starts_at_pause else 5.0)
        q.start_epoch, q.first_token_s = start, pause_s
        q.chunk_times_s = [pause_s + 0.012 * i for i in range(24)]
        q.end_s = q.chunk_times_s[-1]
        return recs

    assert V.stalls(pair(0.6, True)) == []
    assert [f.requests for f in V.stalls(pair(0.6, False))] == [("p0",)]


def test_rate_cells_and_tiny_cells_are_not_judged_by_the_stall_rule():
    recs = _clean(rate=2.0)
    recs[0] = _rec("p0", 0.260, rate=2.0)
    assert V.stalls(recs) == []
    assert V.stalls(_clean(2)) == []


def _tel(**kw):
    base = {"tel_cpu_cores": 2, "tel_load_1m_mean": 1.6, "tel_cpu_steal_mean_pct": 3.1, "tel_cpu_freq_dropped": False}
    return {**base, **kw}


def test_a_cell_measured_on_a_busy_machine_is_flagged_and_a_quiet_one_is_not():
    assert V.machine_findings([_rec("p", 0.01, **_tel())]) == []  # the quiet VM: load 1.61, steal 3.1 %
    (f,) = V.machine_findings([_rec("p", 0.01, **_tel(tel_load_1m_mean=4.1))])
    assert f.flags and "load 4.10 on 2 cores" in finding_text(f)
    (f,) = V.machine_findings([_rec("p", 0.01, **_tel(tel_cpu_steal_mean_pct=30.0, tel_gpu_other_procs_max=1))])
    assert "CPU steal 30.0 %" in finding_text(f) and "1 other process(es) on the GPU" in finding_text(f)
    (f,) = V.machine_findings([_rec("p", 0.01, **_tel(tel_cpu_freq_dropped=True))])
    assert "CPU clock fell" in finding_text(f)


def test_the_cores_used_outside_the_study_decide_over_the_load_average():
    """vLLM's CPU server held the load at 2.5-2.8 on 2 cores with nothing else running (its own API
    process, engine core and OpenMP threads): the load rule flagged 19 quiet cells of make study-deploy.
    Where the telemetry has the CPU time of processes outside the study's tree, that decides."""
    vllm_alone = _tel(tel_load_1m_mean=2.76, tel_cpu_others_cores_mean=0.04, tel_cpu_study_cores_mean=2.0)
    assert V.machine_findings([_rec("p", 0.01, **vllm_alone)]) == []
    pip_beside = _tel(tel_load_1m_mean=2.6, tel_cpu_others_cores_mean=0.93)
    (f,) = V.machine_findings([_rec("p", 0.01, **pip_beside)])
    assert f.flags and "0.93 of 2 cores used outside the study" in finding_text(f)
    # other work that leaves the load low still counts (a burst shorter than the load average's minute)
    (f,) = V.machine_findings([_rec("p", 0.01, **_tel(tel_load_1m_mean=1.2, tel_cpu_others_cores_mean=0.7))])
    assert "0.70 of 2 cores used outside the study" in finding_text(f)
    # records measured before the split fall back to the load average
    (f,) = V.machine_findings([_rec("p", 0.01, **_tel(tel_load_1m_mean=2.76))])
    assert "load 2.76 on 2 cores" in finding_text(f)


def test_a_flag_on_the_baseline_flags_every_cell_paired_with_it():
    busy = V.Finding("busy machine", "ar", {"reasons": ["load 4.1"]}, True)
    findings = [busy, V.Finding("no chat template", "s2", {"k": 1, "n": 1}, False)]
    out = V.flagged(findings, {"ar": None, "s1": "ar", "s2": "ar", "s3": "other"})
    assert out == {"ar": (("busy machine", False),), "s1": (("busy machine", True),), "s2": (("busy machine", True),)}
    assert V.flagged(findings[1:], {"s2": "ar"}) == {}


def test_synthetic_acceptance_double_bos_and_an_unused_chat_template_are_named():
    r = _rec("p", 0.01, double_bos=True, chat_template_unused=True)
    r.synthetic_acceptance = "alpha=0.8"
    checks = {f.check: f for f in V.workload_findings([r, _rec("q", 0.01, double_bos=False)])}
    assert set(checks) == {"synthetic acceptance", "double BOS", "no chat template"}
    assert finding_text(checks["double BOS"]).startswith("1 of 2 prompts") and not checks["no chat template"].flags
    assert V.workload_findings(_clean()) == []


def test_random_token_prompts_are_caught_outside_the_random_control_only():
    rng = random.Random(0)
    assert V.random_id_share([rng.randrange(50_000) for _ in range(64)], 50_000) > V.RANDOM_ID_SHARE
    assert V.random_id_share([rng.randrange(900) for _ in range(64)], 50_000) < V.RANDOM_ID_SHARE  # text: low ids
    assert V.random_id_share([40_000] * 8, 50_000) is None  # too short to tell
    assert V.random_id_share([rng.randrange(93) for _ in range(64)], 93) is None  # a byte vocabulary: no order
    rnd = _rec("r", 0.01, prompt_id_share=0.5)
    (f,) = V.workload_findings([rnd, _rec("t", 0.01, prompt_id_share=0.02)])
    assert f.check == "random-token prompts" and f.requests == ("r",)
    rnd.input_policy = "tier:1024:random"  # the random control itself
    assert V.workload_findings([rnd]) == []


def test_requests_that_ran_past_eos_are_counted_and_a_cell_that_did_not_passes():
    recs = [_rec("a", 0.01, past_eos_at=6), _rec("b", 0.01, past_eos_at=None)]
    (f,) = V.workload_findings(recs)
    assert (
        f.check == "ran past EOS" and "1 of 2 requests" in finding_text(f) and "38% of output tokens" in finding_text(f)
    )
    assert V.workload_findings([_rec("b", 0.01, past_eos_at=None)]) == []


def test_counters_that_went_backwards_inside_a_cell_flag_it():
    ok = {"drafts": 10, "drafted_tokens": 40, "accepted_tokens": 20, "accepted_per_position": [8, 6]}
    assert V.workload_findings([_rec("a", 0.01, run_acceptance=ok)]) == []
    reset = {**ok, "accepted_tokens": -120}
    (f,) = V.workload_findings([_rec("a", 0.01, run_acceptance=reset)])
    assert f.check == "counters reset" and f.flags and "accepted_tokens" in finding_text(f)


def test_a_prompt_cached_by_an_earlier_cell_is_caught_and_distinct_prompts_pass():
    first, second = [_rec("p0", 0.01, cell="ar")], [_rec("p0", 0.01, cell="ng", method="ngram")]
    for r in first + second:
        r.prefix_cache = True
    second[0].start_epoch = 10.0
    (f,) = V.prefix_cache_reuse({"ar": first, "ng": second})
    assert f.cell_id == "ng" and f.requests == ("p0",)
    second[0].prompt_id = "p1"
    assert V.prefix_cache_reuse({"ar": first, "ng": second}) == []
    second[0].prompt_id, second[0].prefix_cache = "p0", False  # a cache that is off caches nothing
    assert V.prefix_cache_reuse({"ar": first, "ng": second}) == []
    second[0].prefix_cache = True
    first[0].extra["engine_instance"], second[0].extra["engine_instance"] = "1:a:100", "1:a:101"  # a restarted server
    assert V.prefix_cache_reuse({"ar": first, "ng": second}) == []
    second[0].extra["engine_instance"] = "1:a:100"  # the same server process
    assert len(V.prefix_cache_reuse({"ar": first, "ng": second})) == 1


def test_copy_share_reads_an_output_that_restates_its_prompt():
    prompt = 'def add(a, b):\n    """Return the sum of a and b."""\n'
    copied = 'def add(a, b):\n    """Return the sum of a and b."""\n    return a + b'
    assert V.copy_share(prompt, copied) > V.COPY_SHARE_HIGH
    assert V.copy_share(prompt, "It adds two numbers together and gives back their total value") == 0.0
    recs = [_rec("a", 0.01, prompt_copy_share=0.9), _rec("b", 0.01, prompt_copy_share=0.7)]
    assert V.copy_by_task(recs) == {"code": 0.8}


def test_prompt_checks_see_a_doubled_bos_and_an_unused_chat_template():
    class Tok:
        bos_token_id, chat_template = 1, "{{ messages }}"

        def __call__(self, text):
            return {"input_ids": [1] + ([1] if text.startswith("<s>") else []) + [5, 6]}

        def __len__(self):
            return 100

    rec = _rec("p", 0.01)
    rec.output_text = "a b c d"
    doubled = V.prompt_checks(Request("p", "<s>hello"), rec, Tok())
    assert doubled["double_bos"] and doubled["chat_template_unused"]
    clean = V.prompt_checks(Request("p", "hello", messages=(("user", "hello"),)), rec, Tok())
    assert not clean["double_bos"] and not clean["chat_template_unused"]


def test_a_server_busy_when_the_cell_began_is_flagged_and_an_idle_one_passes():
    from specstudy.backends.llamacpp.llamacpp_backend import LlamaCppBackend
    from specstudy.backends.prometheus import parse_prometheus

    b = LlamaCppBackend("m")
    text = "llamacpp:requests_processing {}\nllamacpp:requests_deferred {}\n"
    busy = b.queue_at_start(parse_prometheus(text.format(1, 2)))
    idle = b.queue_at_start(parse_prometheus(text.format(0, 0)))
    assert busy == {"running": 1.0, "waiting": 2.0} and idle == {"running": 0.0, "waiting": 0.0}
    assert b.queue_at_start(None) is None
    (f,) = V.workload_findings([_rec("a", 0.01, server_at_start=busy)])
    assert (
        f.check == "server not idle"
        and f.flags
        and finding_text(f) == "the server had 1 running, 2 waiting when the cell began"
    )
    assert V.workload_findings([_rec("a", 0.01, server_at_start=idle)]) == []


def test_a_request_is_judged_against_requests_of_its_own_input_tier():
    """The issue's length-tier cell: long-context requests decode ~3.5x slower per token than short ones.
    Judged against the whole cell they read as stalls; against their own tier they are normal, and a
    real stall inside the long tier is still caught."""

    def tiered(pid, tpot_s, tier):
        r = _rec(pid, tpot_s)
        r.input_policy = tier
        return r

    short = [tiered(f"s{i}", 0.020, "tier:300") for i in range(5)]
    long = [tiered(f"l{i}", 0.070, "tier:4000") for i in range(3)]
    assert V.stalls(short + long) == []
    slow = tiered("l3", 0.250, "tier:4000")
    assert [f.requests for f in V.stalls([*short, *long, slow])] == [("l3",)]
    few = [tiered(f"l{i}", 0.070, "tier:4000") for i in range(2)]  # too few to judge by: the cell's median
    assert {f.requests for f in V.stalls(short + few)} == {("l0",), ("l1",)}
