"""The runner: warm-up, paired baselines, one part per cell, resume after a kill, failed cells.

Cells run through the real reference engine on a tiny random Llama (no download): prompts are
token ids with repeats in them so n-gram drafting has something to find.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import TINY_STUDY, TinyFactory, run_tiny_study, tiny_requests, write_study

from specstudy.backends.base import ServingBackend
from specstudy.backends.lifecycle import ServerStartError
from specstudy.backends.server_base import ServedBatch, ServerDied
from specstudy.backends.watch import WatchResult
from specstudy.config import load_study
from specstudy.layout import StudyLayout
from specstudy.records import read_part
from specstudy.run.plan import expand
from specstudy.run.pool import BackendPool
from specstudy.run.study_runner import run_study

_run = run_tiny_study


def part_paths(folder):
    return StudyLayout(folder).part_paths()


def read_records(folder):
    return StudyLayout(folder).read_all()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("study")
    cfg = load_study("cpu", write_study(tmp))
    return cfg, expand(cfg)


def test_expansion_pairs_every_speculative_cell_with_a_baseline(tiny):
    cfg, plans = tiny
    ids = [p.cell_id for p in plans]
    assert len(ids) == len(set(ids))
    # 2 tasks x (ar b1, ar b2, ngram b1, ngram b2, layer_skip b1 only)
    assert len(plans) == 2 * 5
    seen = set()
    for p in plans:
        if p.baseline_cell_id:
            base = next(q for q in plans if q.cell_id == p.baseline_cell_id)
            assert base.cell.method == "ar" and base.cell.task == p.cell.task
            assert base.cell.batch_size == p.cell.batch_size and base.sampling == p.sampling
            assert p.baseline_cell_id in seen, "baseline must run before the cells paired with it"
        seen.add(p.cell_id)


def test_run_writes_one_part_per_cell_with_pairing_and_telemetry(tiny, tmp_path):
    cfg, plans = tiny
    factory = TinyFactory()
    res = _run(cfg, plans, tmp_path, factory)
    assert [r.status for r in res] == ["done"] * len(plans)
    parts = part_paths(tmp_path)
    assert sorted(p.stem for p in parts) == sorted(p.cell_id for p in plans)
    recs = read_records(tmp_path)
    assert len(recs) == sum(p.prompts for p in plans)
    # one engine for the whole study (all cells share framework, target and no drafter)
    assert len(factory.loads) == 1
    spec = [r for r in res if r.speedup is not None]
    assert spec and all(r.speedup == r.speedup and r.speedup > 0 for r in spec)
    for r in recs:
        assert r.extra["warmup_requests"] in (0, 1) and "load_1m" in r.extra and "tel_rss_peak_bytes" in r.extra
        assert r.cell_id in {p.cell_id for p in plans}
        assert not r.prompt_id.startswith("warmup")
    early = [r for r in recs if r.method == "layer_skip"]
    assert early and all(r.drafted_tokens and r.drafted_tokens >= (r.accepted_tokens or 0) for r in early)
    assert all(r.drafted_tokens is None or r.drafted_tokens == 0 for r in recs if r.method == "ar")
    assert (tmp_path / "study.json").exists() and (tmp_path / "provenance.json").exists()
    assert len(list((tmp_path / "telemetry").glob("*.parquet"))) == len(plans)
    # warm-up once per (engine, method, γ, batch): here ar b1/b2, ngram b1/b2, layer_skip b1
    warmed = {r.cell_id for r in recs if r.extra["warmup_requests"] == 1}
    assert len(warmed) == 5 and all(r.extra["warmup_scope"] for r in recs)


def test_a_warm_engine_warms_a_later_method_up_with_the_shorter_length(tiny, tmp_path):
    """The engine's first warm-up decodes ``warmup.max_new_tokens``; a later method, γ or batch size
    on the same loaded engine decodes ``warm_engine_max_new_tokens``; measured requests keep theirs."""
    cfg, plans = tiny
    cfg = dataclasses.replace(cfg, warmup_max_new_tokens=6, warm_engine_warmup_tokens=2)
    factory = TinyFactory()
    _run(cfg, plans, tmp_path, factory)
    warm = [n for _, _, n, w in factory.runs if w]
    assert len(warm) == 5 and warm[0] == 6 and set(warm[1:]) == {2}
    assert all(n == plans[0].sampling.max_new_tokens for _, _, n, w in factory.runs if not w)
    by_cell = {r.cell_id: r.extra for r in read_records(tmp_path)}
    assert sorted(e["warmup_max_new_tokens"] for e in by_cell.values() if e["warmup_requests"]) == [2, 2, 2, 2, 6]
    assert all(e["warmup_max_new_tokens"] == 0 for e in by_cell.values() if not e["warmup_requests"])


def test_an_engine_loaded_again_is_warmed_up_again_at_full_length(tiny):
    """Warm-up bookkeeping follows the loaded engine, not its key: one evicted and loaded again is cold."""
    from specstudy.run.cell_runner import RunState, plan_warmup

    class Engine:
        pass

    cfg, plans = tiny
    cfg = dataclasses.replace(cfg, warmup_max_new_tokens=6, warm_engine_warmup_tokens=2)
    ar, other = plans[0], next(p for p in plans if p.cell.method != plans[0].cell.method)
    state, first, reloaded, reqs = RunState(), Engine(), Engine(), tiny_requests("code", 1, 0, None)

    def warm(engine, plan, measured=reqs):
        w = plan_warmup(state, engine, plan, cfg, reqs, measured)
        return w.requests, w.tokens

    assert warm(first, ar) == (reqs, 6)
    assert warm(first, ar)[0] == []  # this configuration is warm on this engine
    assert warm(first, other) == (reqs, 2)  # a warm engine, a new configuration
    assert warm(reloaded, ar) == (reqs, 6)  # a new engine object: cold


def test_every_configuration_an_engine_has_not_served_gets_an_untimed_request_first(tiny):
    """Sampling, output length, prefix cache and input length each change an engine's cost on first
    use; a server that ran its own (greedy) load-time warm-up gets the study's too."""
    from specstudy.run.cell_runner import RunState, plan_warmup

    class Engine:
        warms_itself = True  # llama.cpp's own warm-up at load

    cfg, plans = tiny
    ar, state, engine = plans[0], RunState(), Engine()
    reqs = tiny_requests("code", 2, 0, None)
    first = plan_warmup(state, engine, ar, cfg, reqs, reqs)
    assert first.requests == reqs and first.warmed_by == ar.cell_id  # a self-warming server included
    assert plan_warmup(state, engine, ar, cfg, reqs, reqs).requests == []
    variants = [
        dataclasses.replace(ar, sampling=dataclasses.replace(ar.sampling, temperature=0.7)),
        dataclasses.replace(ar, sampling=dataclasses.replace(ar.sampling, top_p=0.9)),
        dataclasses.replace(ar, sampling=dataclasses.replace(ar.sampling, max_new_tokens=64)),
        dataclasses.replace(ar, prefix_cache=not ar.prefix_cache),
        dataclasses.replace(ar, cell=dataclasses.replace(ar.cell, batch_size=4)),
    ]
    for v in variants:
        assert plan_warmup(state, engine, v, cfg, reqs, reqs).requests == reqs, v
    long = [dataclasses.replace(r, prompt_ids=r.prompt_ids * 40) for r in reqs]  # a new input-length regime
    w = plan_warmup(state, engine, ar, cfg, reqs, long)
    assert w.requests == reqs and w.note()["warmup_ran_for_cell"]
    again = plan_warmup(state, engine, ar, cfg, reqs, reqs)
    assert again.note() == {"warmup_key": repr(again.key), "warmed_by": ar.cell_id, "warmup_ran_for_cell": False}


def _stall(cells, attempts):
    """A planted stall: the first measured record of each of ``cells`` at the given measured calls
    (1-based, counted over the study) decodes 30x slower than it did."""

    def plant(cell, rec, calls):
        if cell.id in cells and calls in attempts and rec.prompt_id.endswith("/0"):
            t0 = rec.first_token_s
            rec.chunk_times_s = [t0 + 30 * (t - t0) for t in rec.chunk_times_s]
            rec.end_s = t0 + 30 * (rec.end_s - t0)

    return plant


@pytest.mark.validity
def test_a_cell_with_a_stalled_request_runs_once_more_and_a_clean_rerun_replaces_it(tiny, tmp_path):
    from specstudy.analysis import validity

    cfg, plans = tiny
    plan = dataclasses.replace(plans[0], prompts=4)  # a cell median needs 3 requests or more
    victim = plan.cell_id
    factory = TinyFactory(plant=_stall({victim}, {1}))
    res = _run(cfg, [plan], tmp_path, factory)
    assert res[0].status == "done" and "1 stalled request(s), rerun once: clean" in res[0].line(1, 1)
    recs = read_records(tmp_path)
    assert all(r.extra["first_attempt_stalls"] for r in recs) and len(recs) == 4
    # only the stalled prompt ran again (a rerun costs what the stall cost), its record replacing the first
    assert [r.prompt_id for r in recs if r.extra.get("attempt") == 2] == [f"{plan.cell.task}/0"]
    measured = [n for n, (*_, warm) in zip(factory.sizes, factory.runs) if not warm]
    assert measured == [4, 1]  # the cell's 4 prompts, then the stalled one alone
    assert all(r.extra["warmed_by"] == victim and r.extra["engine_instance"].count(":") == 2 for r in recs)
    assert validity.stalls(recs) == []
    first = StudyLayout(tmp_path).stalled_path(victim)
    assert first.exists() and validity.stalls(read_part(first))  # the stalled attempt, kept beside


@pytest.mark.validity
def test_a_stall_that_recurs_in_the_rerun_keeps_the_cell_flagged(tiny, tmp_path):
    from specstudy.analysis import validity

    cfg, plans = tiny
    plan = dataclasses.replace(plans[0], prompts=4)
    victim = plan.cell_id
    res = _run(cfg, [plan], tmp_path, TinyFactory(plant=_stall({victim}, {1, 2})))
    assert "rerun once: 1 stalled again, cell flagged" in res[0].line(1, 1)
    found = validity.stalls(read_records(tmp_path))
    assert len(found) == 1 and found[0].requests[0].endswith("/0") and found[0].flags


def test_rerun_skips_finished_cells_without_duplicates(tiny, tmp_path):
    cfg, plans = tiny
    first = _run(cfg, plans, tmp_path, TinyFactory(), max_cells=3)
    assert sum(r.status == "done" for r in first) == 3
    mtimes = {p.name: p.stat().st_mtime_ns for p in part_paths(tmp_path)}
    factory = TinyFactory()
    second = _run(cfg, plans, tmp_path, factory)
    assert sum(r.status == "skipped" for r in second) == 3
    assert sum(r.status == "done" for r in second) == len(plans) - 3
    for name, m in mtimes.items():
        assert (tmp_path / "records" / name).stat().st_mtime_ns == m, "a finished cell was redone"
    recs = read_records(tmp_path)
    keys = [(r.cell_id, r.prompt_id, r.repeat) for r in recs]
    assert len(keys) == len(set(keys)) == sum(p.prompts for p in plans)


def test_failed_cell_is_reported_and_others_continue(tiny, tmp_path):
    cfg, plans = tiny
    res = _run(cfg, plans, tmp_path, TinyFactory(fail_method="layer_skip"))
    failed = [r for r in res if r.status == "failed"]
    assert failed and all("injected failure" in r.message for r in failed)
    assert all(r.status == "done" for r in res if r not in failed)
    assert sorted(p.stem for p in (tmp_path / "failed").glob("*.json")) == sorted(r.cell_id for r in failed)
    assert len(StudyLayout(tmp_path).failed_cells()) == len(failed)
    again = _run(cfg, plans, tmp_path, TinyFactory())  # fixed: only the failed cells run
    assert sorted(r.cell_id for r in again if r.status == "done") == sorted(r.cell_id for r in failed)
    assert StudyLayout(tmp_path).failed_cells() == []


def test_engine_failure_fails_its_cells_once(tiny, tmp_path):
    cfg, plans = tiny
    calls = []

    def broken(framework, **kw):
        calls.append(kw)
        raise OSError("no such model")

    res = _run(cfg, plans, tmp_path, broken)
    assert all(r.status == "failed" for r in res) and len(calls) == 1
    assert "no such model" in res[-1].message


def test_backend_pool_reuses_an_engine_for_drafterless_cells(tiny):
    cfg, plans = tiny
    made = []
    pool = BackendPool(cfg, lambda fw, **o: made.append(o.get("drafter")) or object(), log=lambda m: None)
    import dataclasses

    p0 = plans[0]
    # the reference engine loads each cell's drafter itself: one engine per target, started without one
    ref_drafter = dataclasses.replace(p0, drafter_id="self:1")
    a = pool.get(ref_drafter)
    assert pool.get(p0) is a and made == [None]
    # an engine that takes its drafter at start (hf): AR cells reuse it, no second load
    hf = dataclasses.replace(p0, cell=dataclasses.replace(p0.cell, framework="hf"))
    hf_drafter = dataclasses.replace(hf, drafter_id="some-drafter")
    b = pool.get(hf_drafter)
    assert pool.get(hf) is b and made == [None, "some-drafter"]


def test_a_drafter_variant_replaces_the_drafterless_copy_of_its_target(tiny):
    """AR cells load hf without a drafter, then its draft_target cells load it with one: the first
    copy is closed before the second loads (two fp32 copies of a 1.5B target fill this machine)."""
    import dataclasses

    cfg, plans = tiny
    closed = []

    class Engine:
        def __init__(self, drafter):
            self.drafter = drafter

        def close(self):
            closed.append(self.drafter)

    pool = BackendPool(cfg, lambda fw, **o: Engine(o.get("drafter")), log=lambda m: None)
    p0 = plans[0]
    hf = dataclasses.replace(p0, cell=dataclasses.replace(p0.cell, framework="hf"))
    plain = pool.get(hf)
    with_drafter = pool.get(dataclasses.replace(hf, drafter_id="some-drafter"))
    assert closed == [None] and list(pool.loaded.values()) == [with_drafter] and plain is not with_drafter
    assert pool.get(hf) is with_drafter  # the AR cells that come later reuse it


KILL_SCRIPT = """
import sys
sys.path[:0] = [{repo!r}, {tests!r}]
from support import TinyFactory, run_tiny_study
from specstudy.config import load_study
from specstudy.run.plan import expand
cfg = load_study("cpu", {yaml!r})
run_tiny_study(cfg, expand(cfg), {out!r}, TinyFactory(hold=({hold!r}, 7)))
"""


def test_killed_study_resumes_without_redoing_or_duplicating(tmp_path):
    """SIGKILL a running study mid-cell, rerun it: finished parts untouched, nothing lost or doubled.
    The first AR cell and its two twins are measured in time (2 prompts x 3 arms: 6 calls), so the
    7th measured call is the first of the next group."""
    yaml = write_study(tmp_path)
    out = tmp_path / "out"
    script = tmp_path / "run.py"
    script.write_text(
        KILL_SCRIPT.format(
            repo=str(Path(__file__).parents[2]),
            tests=str(Path(__file__).parents[1]),
            yaml=str(yaml),
            out=str(out),
            hold=str(tmp_path / "second-group-in-flight"),
        )
    )
    hold = tmp_path / "second-group-in-flight"  # touched by the fake engine mid-way through the second group
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    try:
        while time.time() < deadline and not hold.exists():
            assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    before = {p.name: p.stat().st_mtime_ns for p in part_paths(out)}
    cfg = load_study("cpu", yaml)
    plans = expand(cfg)
    assert len(before) == 3 < len(plans), "the kill must land in the second group of cells"
    res = _run(cfg, plans, out, TinyFactory())
    assert sum(r.status == "skipped" for r in res) == len(before)
    assert all(r.status in ("done", "skipped") for r in res)
    for name, m in before.items():
        assert (out / "records" / name).stat().st_mtime_ns == m
    recs = read_records(out)
    keys = [(r.cell_id, r.prompt_id, r.repeat) for r in recs]
    assert len(keys) == len(set(keys)) == sum(p.prompts for p in plans)
    assert {r.cell_id for r in recs} == {p.cell_id for p in plans}
    log = (out / "run.log").read_text()
    assert "done earlier, skipped" in log or "done earlier" in log
    json.loads((out / "study.json").read_text())


class FakeServer(ServingBackend):
    """A server backend stand-in (no process): records what the runner asks of it."""

    framework = "openai"

    def __init__(self, **opts):
        self.opts, self.started, self.sent, self.offsets = opts, [], 0, []
        self.tokenizer = None

    def ensure_server(self, cell):
        self.started.append((cell.method, cell.gamma, dict(cell.options).get("rate")))

    def send(self, request, sampling, cell, timeout_s=None):
        self.sent += 1
        rec = cell.new_record(
            request, sampling, output_tokens=4, first_token_s=0.01, end_s=0.02, start_epoch=time.time()
        )
        return rec

    def scrape(self):
        return {"sent": self.sent}

    def run_acceptance(self, before, after, records):
        return {"source": "fake counters", "requests": after["sent"] - before["sent"]}

    def offer_run(self, run, *, gauges=True):
        self.offsets.append(list(run.offsets))
        before = self.scrape()
        recs = [self.send(r, run.sampling, run.cell) for r in run.requests]
        return ServedBatch(recs, 0.1, self.run_acceptance(before, self.scrape(), recs), WatchResult())

    def run(self, requests, sampling, cell):  # pragma: no cover - rate cells must not use it
        raise AssertionError("a request-rate cell must go through the arrival-process driver")

    def close(self):
        pass


def test_request_rate_cells_drive_a_server_at_that_rate(tmp_path):
    text = (
        TINY_STUDY.replace("frameworks: [reference]", "frameworks: [openai]\n  request_rates: [2, inf]")
        .replace("    - {method: layer_skip, label: Early exit, options: {exit_layer: 1}, max_batch_size: 1}\n", "")
        .replace("batch_sizes: [1, 2]", "batch_sizes: [1]")
    )
    cfg = load_study("cpu", write_study(tmp_path, text))
    plans = expand(cfg)
    assert {p.request_rate for p in plans} == {2.0, float("inf")}
    servers = []
    res = run_study(
        cfg,
        plans,
        StudyLayout(tmp_path / "out"),
        factory=lambda fw, **o: servers.append(FakeServer(**o)) or servers[-1],
        request_loader=tiny_requests,
        progress=False,
        log=lambda m: None,
    )
    assert all(r.status == "done" for r in res), [r.message for r in res]
    recs = read_records(tmp_path / "out")
    assert len(recs) == sum(p.prompts for p in plans)
    assert all(r.extra["run_acceptance"]["requests"] == 2 for r in recs)  # scoped to the cell's own run
    started = [s for srv in servers for s in srv.started]
    assert {s[2] for s in started} == {2.0, "inf"}
    assert all(srv.opts.get("prefix_cache") is False for srv in servers)
    # the arrival schedule: all at once at inf, a Poisson process (increasing send times) at 2 req/s
    offsets = [o for srv in servers for o in srv.offsets]
    assert any(all(t == 0.0 for t in o) for o in offsets)
    assert any(o[-1] > 0 and o == sorted(o) for o in offsets)


class QueueingServer(FakeServer):
    """A server stand-in whose first token waits 10 s from 2 req/s up: the SLO breaks there."""

    def send(self, request, sampling, cell, timeout_s=None):
        rec = super().send(request, sampling, cell, timeout_s)
        if float(dict(cell.options)["rate"]) >= 2:
            rec.first_token_s, rec.end_s = 10.0, 10.01
        return rec


@pytest.mark.parametrize("search", [True, False])
def test_a_capacity_search_does_not_probe_above_its_first_break(tmp_path, search):
    """`--refine-capacity`: per repeat, rates run lowest first and once one broke the SLO the rates above it
    are not probed (the capacity cannot change); without the search every rate of the sweep runs."""
    text = (
        TINY_STUDY.replace(
            "frameworks: [reference]", "frameworks: [openai]\n  request_rates: [4, 1, 2]\n  slo: {ttft_ms: 1000}"
        )
        .replace("    - {method: layer_skip, label: Early exit, options: {exit_layer: 1}, max_batch_size: 1}\n", "")
        .replace("batch_sizes: [1, 2]", "batch_sizes: [1]")
        .replace("tasks: [code, chat]", "tasks: [code]")
        .replace("repeats: 1", "repeats: 2")
    )
    cfg = load_study("cpu", write_study(tmp_path, text))
    plans = expand(cfg)
    lines = []
    kw = dict(factory=lambda fw, **o: QueueingServer(**o), request_loader=tiny_requests, progress=False)
    res = run_study(cfg, plans, StudyLayout(tmp_path / "out"), log=lines.append, capacity_search=search, **kw)
    rate = {p.cell_id: p.request_rate for p in plans}
    ran = sorted(rate[r.cell_id] for r in res if r.status == "done")
    assert len(plans) == 12  # AR and prompt lookup, 2 repeats, 3 rates
    if search:
        assert ran == [1.0] * 4 + [2.0] * 4
        assert {rate[r.cell_id] for r in res if r.status == "skipped"} == {4.0}
        assert sum("not probed: its search broke the SLO at 2 req/s" in m for m in lines) == 4
    else:
        assert ran == [1.0] * 4 + [2.0] * 4 + [4.0] * 4


class GrowingQueueServer(FakeServer):
    """A server stand-in for a two-round search: at 40 req/s repeat 0's first tokens wait longer with every
    request (a queue still growing, under the SLO) and repeat 1's do not; from 80 req/s up they wait 10 s."""

    def send(self, request, sampling, cell, timeout_s=None):
        rec = super().send(request, sampling, cell, timeout_s)
        rate, tail = float(dict(cell.options)["rate"]), request.prompt_id.rsplit("/", 1)[-1]
        i = int(tail) if tail.isdigit() else 0  # a warm-up request is no prompt of the task
        rec.start_epoch = 1000.0 + i / rate  # arrivals spread at the rate (this stand-in sends at once)
        if rate >= 80:
            rec.first_token_s, rec.end_s = 10.0, 10.01
        elif rate >= 40 and cell.repeat == 0:
            rec.first_token_s, rec.end_s = 0.02 * (i + 1), 0.02 * (i + 1) + 0.01
        return rec


def test_a_search_round_runs_only_the_probes_that_can_move_each_repeats_capacity(tmp_path):
    """A round's sweeps hold what any repeat needs; each repeat skips a rate below one it held, a longer rerun
    of a probe that broke, and one of a probe whose queue was steady, and reruns first the probe that held
    while its queue grew (the one that decides its capacity), the rates below it only if that one breaks."""
    first = (
        TINY_STUDY.replace(
            "frameworks: [reference]", "frameworks: [openai]\n  request_rates: [20, 40, 80]\n  slo: {ttft_ms: 1000}"
        )
        .replace("    - {method: layer_skip, label: Early exit, options: {exit_layer: 1}, max_batch_size: 1}\n", "")
        .replace("    - {method: ngram, label: Prompt lookup, options: {ngram_min: 1, ngram_max: 2}}\n", "")
        .replace("batch_sizes: [1, 2]", "batch_sizes: [1]")
        .replace("tasks: [code, chat]", "tasks: [code]")
        .replace("repeats: 1", "repeats: 2")
        .replace("prompts_per_task: 2", "prompts_per_task: 6")
    )
    layout, lines = StudyLayout(tmp_path / "out"), []
    kw = dict(factory=lambda fw, **o: GrowingQueueServer(**o), request_loader=tiny_requests, progress=False)
    cfg = load_study("cpu", write_study(tmp_path, first))
    res = run_study(cfg, expand(cfg), layout, log=lines.append, capacity_search=True, **kw)
    # bisection: 40 first; it held in both repeats (its queue growing in repeat 0, steady in repeat 1), so 20
    # is not probed in either (repeat 0's 40 is rerun longer first, next round); 80 broke in both
    assert {(r.cell_id.split("_r")[1][0], r.message or r.status) for r in res} == {
        ("0", "done"),
        ("0", "not probed: its search held the SLO at 40 req/s with its queue growing"),
        ("1", "done"),
        ("1", "not probed: its search held the SLO at 40 req/s with a steady queue"),
    }, [r.message for r in res]
    assert sum(r.status == "done" for r in res) == 4
    second = first + "  sweeps:\n    probes: {}\n    longer: {request_rates: [10, 20, 40, 80], prompts_per_task: 12}\n"
    cfg = load_study("cpu", write_study(tmp_path, second))
    every = expand(cfg)
    plans = [p for p in every if p.sweeps == ("longer",)]
    res = run_study(cfg, plans, layout, log=lines.append, capacity_search=True, full_plan=every, **kw)
    by_id = {r.cell_id: r for r in res}  # the runner orders each search's probes for its bisection
    why = {
        (p.cell.repeat, p.request_rate): r.message if r.status == "skipped" else r.status
        for p in plans
        for r in [by_id[p.cell_id]]
    }
    assert why == {
        # 40 rerun longer first: it held again (its queue still growing), so nothing below it is needed
        (0, 10.0): "not probed: its search held the SLO at 40 req/s with its queue growing",
        (0, 20.0): "not probed: its search held the SLO at 40 req/s with its queue growing",
        (0, 40.0): "done",
        (0, 80.0): "not rerun longer: its 6-request probe broke the SLO",
        (1, 10.0): "not probed: its search held the SLO at 40 req/s with a steady queue",
        (1, 20.0): "not probed: its search held the SLO at 40 req/s with a steady queue",
        (1, 40.0): "not rerun longer: its 6-request probe was steady",
        (1, 80.0): "not rerun longer: its 6-request probe broke the SLO",
    }


class DyingServer(FakeServer):
    """A server stand-in whose first batch run ends with its server dying mid-cell."""

    died = 0

    def run(self, requests, sampling, cell):
        self.ensure_server(cell)
        recs = [self.send(r, sampling, cell) for r in requests]
        if DyingServer.died == 0:
            DyingServer.died += 1
            for r in recs[1:]:
                r.status, r.error = "error", "server exited with code 9 during the run; log x.log, last lines:\nboom"
            raise ServerDied("server exited with code 9 during the run; log x.log, last lines:\nboom", recs)
        yield from recs


def test_a_server_that_dies_fails_its_cell_keeps_its_rows_and_a_rerun_retries_it(tmp_path):
    text = (
        TINY_STUDY.replace("frameworks: [reference]", "frameworks: [openai]")
        .replace("    - {method: layer_skip, label: Early exit, options: {exit_layer: 1}, max_batch_size: 1}\n", "")
        .replace("batch_sizes: [1, 2]", "batch_sizes: [1]")
    )
    cfg = load_study("cpu", write_study(tmp_path, text))
    plans = expand(cfg)
    layout = StudyLayout(tmp_path / "out")
    DyingServer.died = 0
    kw = dict(
        factory=lambda fw, **o: DyingServer(**o), request_loader=tiny_requests, progress=False, log=lambda m: None
    )
    res = run_study(cfg, plans, layout, **kw)
    failed = [r for r in res if r.status == "failed"]
    assert len(failed) == 1 and "server exited with code 9" in failed[0].message
    assert sum(r.status == "done" for r in res) == len(plans) - 1  # the study went on
    cid = failed[0].cell_id
    assert not layout.is_done(cid)  # not counted as measured
    doc = layout.failed_cells()[0]
    assert doc["cell_id"] == cid and "boom" in doc["error"]  # the server's last log lines
    rows = read_part(layout.failed_rows_path(cid))
    assert [r.status for r in rows] == ["ok"] + ["error"] * (len(rows) - 1) and rows[0].cell_id == cid
    again = run_study(cfg, plans, layout, **kw)  # the rerun retries only the failed cell
    assert [r.cell_id for r in again if r.status == "done"] == [cid]
    assert layout.is_done(cid) and not layout.failed_cells() and not layout.failed_rows_path(cid).exists()


class NgramWontStart(FakeServer):
    """A server stand-in whose n-gram configuration never starts (its AR configuration does)."""

    starts: list[str] = []

    def run(self, requests, sampling, cell):
        if cell.method != "ar":
            NgramWontStart.starts.append(cell.method)
            raise ServerStartError(f"server exited with code 1 before it was ready ({cell.method})")
        self.ensure_server(cell)
        yield from (self.send(r, sampling, cell) for r in requests)


def test_an_engine_configuration_that_fails_to_start_is_not_started_again(tmp_path):
    text = (
        TINY_STUDY.replace("frameworks: [reference]", "frameworks: [openai]")
        .replace("    - {method: layer_skip, label: Early exit, options: {exit_layer: 1}, max_batch_size: 1}\n", "")
        .replace("batch_sizes: [1, 2]", "batch_sizes: [1]")
    )
    cfg = load_study("cpu", write_study(tmp_path, text))
    plans = expand(cfg)
    spec = [p for p in plans if p.cell.method != "ar"]
    same = {p.engine_config_key() for p in spec}
    assert len(spec) > len(same)  # several cells share a configuration: the case under test
    NgramWontStart.starts = []
    res = run_study(
        cfg,
        plans,
        StudyLayout(tmp_path / "out"),
        factory=lambda fw, **o: NgramWontStart(**o),
        request_loader=tiny_requests,
        progress=False,
        log=lambda m: None,
    )
    failed = [r for r in res if r.status == "failed"]
    assert len(failed) == len(spec) and len(NgramWontStart.starts) == len(same)
    assert any("failed to start earlier" in r.message for r in failed)
    assert all(r.status == "done" for r in res if r not in failed)  # AR cells still ran


def test_every_server_the_study_starts_logs_under_the_studys_own_outputs_folder(tmp_path, monkeypatch):
    """Server and worker logs go to <outputs>/<hw>/servers/, not to outputs/servers/ of the working directory."""
    text = (
        TINY_STUDY.replace("frameworks: [reference]", "frameworks: [openai]\n  request_rates: [inf]")
        .replace("    - {method: layer_skip, label: Early exit, options: {exit_layer: 1}, max_batch_size: 1}\n", "")
        .replace("batch_sizes: [1, 2]", "batch_sizes: [1]")
    )
    cfg = load_study("cpu", write_study(tmp_path, text))
    elsewhere = tmp_path / "elsewhere" / "cpu"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    servers = []
    res = run_study(
        cfg,
        expand(cfg),
        StudyLayout(elsewhere),
        factory=lambda fw, **o: servers.append(FakeServer(**o)) or servers[-1],
        request_loader=tiny_requests,
        progress=False,
        log=lambda m: None,
    )
    assert all(r.status == "done" for r in res) and servers
    assert {srv.opts["log_dir"] for srv in servers} == {str(elsewhere / "servers")}
    assert not (cwd / "outputs").exists()


BUSY = ["load 4.10 on 2 cores (above 0.5 before the engine; the kit needs 2 of them)"]


@pytest.mark.validity
def test_strict_refuses_a_busy_machine_before_any_engine_loads(tmp_path, monkeypatch, capsys):
    import specstudy.telemetry as tel
    from specstudy.cli import main

    monkeypatch.setattr(tel, "machine_check", lambda needed: BUSY)
    out = tmp_path / "out"
    rc = main(["run", "--params", str(write_study(tmp_path)), "--outputs", str(out), "--strict", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "the machine is busy (load 4.10 on 2 cores" in err and "--strict refuses" in err
    assert not (out / "cpu" / "records").exists()  # nothing ran, nothing loaded


@pytest.mark.validity
def test_a_busy_machine_without_strict_is_named_in_a_warning_and_a_quiet_one_says_nothing(tiny, capsys):
    from specstudy.commands.run_command import machine_fit

    cfg, _ = tiny
    assert machine_fit(cfg, strict=False, check=lambda needed: BUSY) is None
    assert "warning: the machine is busy (load 4.10" in capsys.readouterr().err
    assert machine_fit(cfg, strict=True, check=lambda needed: []) is None
    assert capsys.readouterr().err == ""


@pytest.mark.validity
def test_the_machine_rule_separates_the_quiet_and_the_loaded_vm():
    from specstudy.telemetry import busy_reasons

    assert busy_reasons(1.61, 2, 2, during=True, steal_pct=3.1) == []  # quiet `make study`
    assert busy_reasons(3.4, 2, 2, during=True)  # one busy loop per core beside it
    assert busy_reasons(0.3, 2, 2, during=False) == [] and busy_reasons(2.0, 2, 2, during=False)
    assert busy_reasons(2.0, 16, 1, during=False) == []  # a GPU box: the client needs one core
    # the start check reads the cores busy now: a load average trailing a finished job is not a busy
    # machine, and a busy loop started seconds ago is, before the load average shows it
    assert busy_reasons(0.82, 2, 2, during=False, busy_cores_now=0.1) == []
    (why,) = busy_reasons(0.3, 2, 2, during=False, busy_cores_now=1.0)
    assert why == "1.0 of 2 cores busy now (load average 0.30), above 0.5 before the engine; the kit needs 2 of them"
    assert busy_reasons(0.3, 16, 1, during=False, busy_cores_now=3.0) == []  # a GPU box: 15 cores to spare
    (why,) = busy_reasons(3.4, 2, 2, during=True)
    assert why == "load 3.40 on 2 cores (above 2.5 while the cell ran)"


def test_the_runner_stamps_where_an_ignore_eos_request_would_have_stopped_and_the_prompt_checks(tiny):
    from specstudy.records import Cell, Request
    from specstudy.run.cell_runner import stamp_checks

    class Tok:
        bos_token_id, eos_token_id, chat_template = 1, 2, None

        def __call__(self, text):
            return {"input_ids": [1, 1, 7, 8]}

        def __len__(self):
            return 100

    _, plans = tiny
    plan = plans[0]
    assert plan.sampling.ignore_eos
    cell = Cell("s", "cpu", "reference", "ar", "code", "m", id="c")
    past, clean = (
        cell.new_record(Request(pid, "p"), plan.sampling, output_ids=ids, output_tokens=len(ids))
        for pid, ids in (("a", [5, 2, 6, 7]), ("b", [5, 6, 7, 2]))
    )
    stamp_checks([past, clean], [Request("a", "p"), Request("b", "p")], Tok(), plan)
    assert past.extra["past_eos_at"] == 2 and clean.extra["past_eos_at"] is None  # an EOS last is a natural stop
    assert past.extra["double_bos"] is True and past.extra["chat_template_unused"] is False
