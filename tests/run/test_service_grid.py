"""The capacity search starts from the service rate this machine measured, not a grid written for another.

A stand-in server with two slots serves each request in a fixed time S (no process): a closed loop of
two clients is served at 2 / S requests per second, and Poisson arrivals above that queue.  The same
study file (no request rate in it) runs against a slow server and one four times faster: each
measures its own service rate, probes around it, and after the refinement rounds every repeat's
capacity is bracketed within the stated width.
"""

from __future__ import annotations

import heapq

import pytest
from support import TINY_STUDY, tiny_requests, write_study

from specstudy.analysis.capacity import capacity_frame, probes
from specstudy.analysis.study_records import load
from specstudy.backends.base import ServingBackend
from specstudy.backends.loadgen import Offer
from specstudy.backends.server_base import ServedBatch
from specstudy.backends.watch import WatchResult
from specstudy.commands.run_command import _refined
from specstudy.config import load_study
from specstudy.layout import StudyLayout
from specstudy.run.plan import expand
from specstudy.run.service_grid import RESOLUTION, with_service_rates
from specstudy.run.study_runner import run_study

SLOTS = 2

STUDY = (
    TINY_STUDY.replace(
        "frameworks: [reference]", "frameworks: [openai]\n  slo: {ttft_ms: 3000, tpot_ms: null, percentile: 90}"
    )
    .replace("    - {method: ngram, label: Prompt lookup, options: {ngram_min: 1, ngram_max: 2}}\n", "")
    .replace("    - {method: layer_skip, label: Early exit, options: {exit_layer: 1}, max_batch_size: 1}\n", "")
    .replace("batch_sizes: [1, 2]", "batch_sizes: [2]")
    .replace("tasks: [code, chat]", "tasks: [code]")
    .replace("repeats: 1", "repeats: 5")
    .replace("prompts_per_task: 2", "prompts_per_task: 40")
    + "  sweeps:\n    capacity: {rates_from_service: [0.7, 1.0, 1.4]}\n"
)


class SlotServer(ServingBackend):
    """Two slots, each request ``service_s`` long, FIFO; a client cap holds requests at the client."""

    framework = "openai"

    def __init__(self, service_s: float):
        self.service_s, self.tokenizer = service_s, None

    def ensure_server(self, cell):
        pass

    def offer_run(self, run, *, gauges=True):
        free = [0.0] * min(SLOTS, run.concurrency or SLOTS)
        recs = []
        for req, arrive in zip(run.requests, run.offsets):
            start = max(arrive, heapq.heappop(free))
            heapq.heappush(free, start + self.service_s)
            rec = run.cell.new_record(req, run.sampling, output_tokens=6, first_token_s=0.05, end_s=self.service_s)
            rec.start_epoch = 1000.0 + start
            if run.concurrency is None:  # queued at the server: the wait is in the first token
                rec.start_epoch, rec.first_token_s, rec.end_s = (
                    1000.0 + arrive,
                    start - arrive + 0.05,
                    start - arrive + self.service_s,
                )
            else:
                rec.extra["queued_s"] = start - arrive
            recs.append(rec)
        return ServedBatch(recs, 0.1, None, WatchResult())

    def run(self, requests, sampling, cell):
        """A closed loop of ``batch_size`` clients: every request there at once, held at the client."""
        yield from self.offer_run(
            Offer(list(requests), sampling, cell, [0.0] * len(requests), cell.batch_size, 60.0, 600.0)
        ).records

    def send(self, request, sampling, cell, timeout_s=None):
        """One request alone (a warm-up): no queue."""
        return cell.new_record(
            request, sampling, output_tokens=6, first_token_s=0.05, end_s=self.service_s, start_epoch=1000.0
        )

    def close(self):
        pass


def _search(tmp_path, service_s: float, rounds: int = 4, study: str = STUDY):
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = load_study("cpu", write_study(tmp_path, study))
    layout = StudyLayout(tmp_path / "out")
    kw = dict(
        factory=lambda fw, **o: SlotServer(service_s), request_loader=tiny_requests, progress=False, log=lambda m: None
    )
    run_study(cfg, expand(cfg), layout, capacity_search=True, **kw)
    cfg, changed = with_service_rates(cfg, layout)
    first = cfg.sweeps[0].request_rates
    every = expand(cfg)
    run_study(
        cfg,
        [p for p in every if set(p.sweeps) & changed and p.request_rate],
        layout,
        full_plan=every,
        capacity_search=True,
        **kw,
    )
    configured = cfg
    for _ in range(rounds):
        refined = _refined(cfg, layout, configured)
        if refined is None:
            break
        cfg, changed = refined
        every = expand(cfg)
        run_study(
            cfg, [p for p in every if set(p.sweeps) & changed], layout, full_plan=every, capacity_search=True, **kw
        )
    study = load(layout.root)
    pr = probes(study)
    return first, capacity_frame(study).iloc[0], pr


@pytest.fixture(scope="module")
def searches(tmp_path_factory):
    """The same file's search on the slow and the fast machine, once for the module's tests."""
    return {s: _search(tmp_path_factory.mktemp(f"s{s}"), s) for s in (2.0, 0.5)}


@pytest.mark.parametrize("service_s", [2.0, 0.5], ids=["slow", "fast"])
def test_the_search_brackets_each_repeats_capacity_from_the_measured_service_rate(searches, service_s):
    first, row, _ = searches[service_s]
    served = SLOTS / service_s
    assert first == pytest.approx(tuple(f * served for f in (0.7, 1.0, 1.4)), rel=0.1)
    assert row["repeats_never_held"] == 0 and row["repeats_never_broke"] == 0
    assert row["widest_bracket"] <= RESOLUTION
    assert 0 < row["capacity_ci_low"] <= row["capacity_rps"] <= row["capacity_ci_high"]


def test_a_machine_four_times_faster_finds_a_higher_capacity_from_the_same_file(searches):
    """The same file, no rate in it: the fast machine's first rates are four times the slow one's and its
    capacity is higher by more than the slow one's bracket (not the x4 of its service rate: the SLO's
    TTFT bound is absolute, so the fast machine's queue may grow further in service times)."""
    (slow_first, slow, _), (fast_first, fast, _) = searches[2.0], searches[0.5]
    assert fast_first == pytest.approx(tuple(4 * r for r in slow_first), rel=0.01)
    assert fast["capacity_rps"] > 2 * slow["capacity_rps"]


def test_a_sweeps_searches_share_one_grid_around_their_median_service_rate():
    """AR and prompt lookup served 1.02 and 1.04 req/s on llama.cpp (make study-deploy, 2026-12-07): one grid of
    three rates, not two grids of six rates 2 % apart that every search would probe."""
    from specstudy.run.service_grid import first_rates

    assert first_rates([1.02, 1.04], [0.7, 1.0, 1.4]) == {0.721, 1.03, 1.44}
    assert first_rates([0.5, 1.0, 4.0], [1.0]) == {1.0}  # the median, not pulled by the fastest


BISECTED = STUDY.replace("rates_from_service: [0.7, 1.0, 1.4]", "rates_from_service: [0.72, 0.85, 1.0, 1.18, 1.39]")


def test_a_fine_first_grid_is_bisected_to_the_stated_width_in_its_first_round(tmp_path):
    """Five first rates 1.18x apart: each repeat probes the middle one first and then only the half its
    verdict points to, so its capacity is bracketed within ``RESOLUTION`` by the first round (no refinement)
    in at most 3 probes (where no held probe's queue grew), where an ascending scan probes every rate up to its
    first break."""
    first, row, pr = _search(tmp_path, 2.0, rounds=0, study=BISECTED)  # its capacity lies inside the grid
    assert len(first) == 5
    assert row["repeats_never_held"] == 0 and row["repeats_never_broke"] == 0
    assert row["widest_bracket"] <= RESOLUTION
    rated = pr[pr["rate"].notna()]
    # a rate held while its queue grew settles nothing below it (a longer probe may break there): those
    # repeats probe lower rates too; the others only their bisection path
    steady = [r for r, g in rated.groupby("repeat") if (g["stationary"] | ~g["held"]).all()]
    assert steady, "every repeat held a rate with its queue growing: the test shows nothing"
    per_repeat = rated.groupby("repeat").size()
    assert per_repeat[steady].max() <= 3, per_repeat.to_dict()


def test_bisection_order_puts_each_searchs_middle_rate_first_and_leaves_other_cells_in_place(tmp_path):
    from specstudy.run.capacity_search import _bisection_ranks, bisection_order

    assert _bisection_ranks(5) == [3, 1, 0, 4, 2]  # order: r2, r1, r4, r0, r3
    assert sorted(_bisection_ranks(13)) == list(range(13)) and _bisection_ranks(13)[6] == 0
    rated = STUDY.replace("rates_from_service: [0.7, 1.0, 1.4]", "request_rates: [1, 2, 3, 4, 5]")
    cfg = load_study("cpu", write_study(tmp_path, rated))
    plans = expand(cfg)
    ordered = bisection_order(plans)
    assert [p.cell_id for p in ordered if p.request_rate is None] == [
        p.cell_id for p in plans if p.request_rate is None
    ]
    first_repeat = [p.request_rate for p in ordered if p.request_rate is not None and p.cell.repeat == 0]
    assert first_repeat == [3, 2, 5, 1, 4]


def test_a_follow_up_round_probes_only_the_repeats_still_without_a_bracket(tmp_path):
    """On the fast machine the first grid holds everywhere for some repeats (never broke): a follow-up round
    (after ``--refine-capacity``'s) adds one step above those repeats' highest held rate and reruns nothing
    longer; the repeats already bracketed skip every probe of it."""
    _search(tmp_path, 0.5, rounds=0, study=BISECTED)
    layout = StudyLayout(tmp_path / "out")
    cfg = load_study("cpu", tmp_path / "tiny.yaml")
    cfg, _ = with_service_rates(cfg, layout)
    before = load(layout.root)
    unbracketed = capacity_frame(before).iloc[0]["repeats_never_broke"]
    assert unbracketed > 0
    cfg2, sweeps = _refined(cfg, layout, cfg, unbracketed_only=True)
    assert sweeps == {"capacity"}  # no longer-rerun sweep in a follow-up round
    (top,) = set(cfg2.sweeps[0].request_rates) - set(cfg.sweeps[0].request_rates)
    assert top > max(cfg.sweeps[0].request_rates)
    every = expand(cfg2)
    res = run_study(
        cfg2,
        [p for p in every if "capacity" in p.sweeps and p.request_rate],
        layout,
        full_plan=every,
        capacity_search=True,
        factory=lambda fw, **o: SlotServer(0.5),
        request_loader=tiny_requests,
        progress=False,
        log=lambda m: None,
    )
    assert sum(r.status == "done" for r in res) == unbracketed  # one probe per unbracketed repeat
