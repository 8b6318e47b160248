"""The deployment decisions: capacity under an SLO, gamma per load, cost and energy per token."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from pydantic import ValidationError

from specstudy.analysis import capacity, cost, gamma_schedule
from specstudy.analysis.study_records import Study, _describe
from specstudy.config.schema import Slo
from specstudy.costmodel import HardwareProfile
from specstudy.layout import StudyLayout
from specstudy.metrics import slo_holds
from specstudy.records import RequestRecord
from specstudy.report import deploy
from specstudy.telemetry import Rapl, energy_of


def rec(
    cell,
    *,
    framework="llamacpp",
    method="ngram",
    label="PL",
    task="code",
    prompt=0,
    repeat=0,
    gamma=4,
    batch=1,
    rate=None,
    base=None,
    ttft=0.05,
    tpot=0.02,
    tokens=21,
    start=0.0,
    status="ok",
    sweeps=("s",),
):
    """One request: ``tokens`` tokens, the first after ``ttft`` s, then one every ``tpot`` s."""
    end = ttft + tpot * (tokens - 1)
    return RequestRecord(
        "s",
        "cpu",
        framework,
        method,
        task,
        f"{task}/{prompt}",
        repeat,
        cell,
        "m",
        label=label,
        sweeps=list(sweeps),
        baseline_cell_id=base,
        request_rate=rate,
        gamma=None if method == "ar" else gamma,
        batch_size=batch,
        output_tokens=tokens,
        start_epoch=start,
        first_token_s=ttft,
        end_s=end,
        status=status,
        drafted_tokens=None if method == "ar" else 0,
        accepted_tokens=None if method == "ar" else 0,
    )


def study_of(records, telemetry=None, profile=None, config=None) -> Study:
    by_cell: dict[str, list[RequestRecord]] = {}
    for r in records:
        by_cell.setdefault(r.cell_id, []).append(r)
    return Study(
        layout=StudyLayout(Path("/nonexistent")),
        hardware="cpu",
        records=by_cell,
        cells={c: _describe(c, rs, None) for c, rs in by_cell.items()},
        plan={"config": config or {}},
        provenance={},
        failed=[],
        telemetry=telemetry,
        profile=profile,
    )


# ---- SLOs -----------------------------------------------------------------------------------


def test_slo_holds_at_the_percentile_and_a_failed_request_is_infinitely_slow():
    fast = [rec("c", prompt=i, tpot=0.02) for i in range(9)]
    slow = rec("c", prompt=9, tpot=0.08)
    assert slo_holds(fast + [slow], tpot_s=0.05, percentile=50) is True
    assert slo_holds(fast + [slow], tpot_s=0.05, percentile=99) is False
    failed = rec("c", prompt=9, status="error")
    assert slo_holds(fast + [failed], ttft_s=1.0, percentile=99) is False
    assert slo_holds([], tpot_s=0.05) is None


def test_a_capacity_probe_counts_the_wait_for_a_slot_and_a_capped_client_cannot_hide_a_queue():
    """Two slots, requests arriving faster than they are served: each later request waits longer for a
    slot at the client, then sees the same 0.5 s TTFT from its send.  Judged from the send the SLO
    held and the queue looked steady (the first make study-deploy design never broke); from the
    arrival it breaks, and the probe reads as a queue still growing."""
    probe = []
    for i in range(8):
        r = rec("q", prompt=i, rate=2.0, batch=2, ttft=0.5, start=0.5 * i)
        r.extra = {"queued_s": 0.6 * max(0, i - 1)} if i > 1 else {}
        probe.append(r)
    assert slo_holds(probe, ttft_s=2.0, percentile=90) is True  # from the send: the queue is invisible
    assert slo_holds(probe, ttft_s=2.0, percentile=90, from_arrival=True) is False
    assert slo_holds(probe, tpot_s=0.05, percentile=90, from_arrival=True) is True  # TPOT: no wait in it
    assert capacity.stationary(probe) is False
    study = study_of(probe)
    (row,) = capacity.probes(study, Slo(ttft_ms=2000)).to_dict("records")
    assert row["held"] is False and row["stationary"] is False


def test_slo_presets_fill_what_is_not_given_and_unknown_ones_are_named():
    mlperf = Slo(preset="mlperf-llama3.1-8b-interactive")
    assert (mlperf.ttft_ms, mlperf.tpot_ms, mlperf.percentile) == (500.0, 30.0, 99.0)
    assert Slo(preset="mlperf-llama3.1-8b-interactive", tpot_ms=40.0).tpot_ms == 40.0
    assert Slo(**mlperf.model_dump()) == mlperf  # the plan's snapshot reloads to the same SLO
    assert mlperf.describe_percentile() == "p99 TTFT ≤ 500 ms and p99 TPOT ≤ 30 ms"
    with pytest.raises(ValidationError, match="allowed: .*'seed-chat'") as e:
        Slo(preset="mlperf-typo")
    assert "mlperf-typo" in str(e.value)


# ---- capacity ---------------------------------------------------------------------------------


def _rate_study(ar_tpot, spec_tpot, repeats=1):
    """AR and prompt lookup at each rate; TPOT per rate as given (the SLO: p90 TPOT <= 50 ms)."""
    out = []
    for r in range(repeats):
        for rate in ar_tpot:
            a, s = f"ar{rate}r{r}", f"pl{rate}r{r}"
            for i in range(5):
                out.append(rec(a, method="ar", label="AR", rate=rate, repeat=r, prompt=i, tpot=ar_tpot[rate]))
                out.append(rec(s, rate=rate, repeat=r, base=a, prompt=i, tpot=spec_tpot[rate][r]))
    return study_of(out, config={"slo": {"tpot_ms": 50.0, "percentile": 90.0}})


def test_capacity_is_the_highest_rate_before_the_first_break_with_its_range_over_repeats():
    rates = {0.5: 0.02, 1.0: 0.03, 2.0: 0.06, 4.0: 0.2}
    spec = {0.5: [0.01, 0.01], 1.0: [0.02, 0.02], 2.0: [0.04, 0.07], 4.0: [0.1, 0.1]}
    frame = capacity.capacity_frame(_rate_study(rates, spec, repeats=2)).set_index("method")
    assert frame.loc["ar", "capacity_rps"] == 1.0 and frame.loc["ar", "breaks_at_rps"] == 2.0
    assert (frame.loc["ngram", "capacity_min_rps"], frame.loc["ngram", "capacity_max_rps"]) == (1.0, 2.0)
    side = capacity.beside_ar(capacity.capacity_frame(_rate_study(rates, spec, repeats=2)))
    assert side["ar_capacity_rps"].tolist() == [1.0]  # capacities 1 and 2: their geometric mean, √2
    assert side["capacity_ratio"].tolist() == [pytest.approx(2**0.5)]
    assert "breaks at" in deploy.capacity_text(frame.loc["ar"])
    assert "not enough repeats for an interval: 2, needs ≥ 5" in deploy.capacity_text(frame.loc["ngram"])
    five = {**frame.loc["ngram"].to_dict(), "repeats": 5, "capacity_ci_low": 1.2, "capacity_ci_high": 1.8}
    assert "1.41 req/s ([1.2, 1.8] over 5 repeats; breaks at" in deploy.capacity_text(five)


def test_a_capacity_is_of_its_output_length_and_the_table_names_it():
    """A rate is a capacity only for its workload: the same AR probes at 24 and at 32 new tokens (cpu-deploy
    went from 32 to 24 on 2026-12-07) are two capacities, never one bracket pooled over both, and the
    capacity table names each one's length."""
    import dataclasses

    rates = {0.5: 0.02, 1.0: 0.03, 2.0: 0.06}
    base = _rate_study(rates, {r: [0.01] for r in rates})
    longer = {
        f"{c}-32": [dataclasses.replace(r, cell_id=f"{c}-32", max_new_tokens=32, end_s=2 * r.end_s) for r in rs]
        for c, rs in base.records.items()
    }
    short = {c: [dataclasses.replace(r, max_new_tokens=24) for r in rs] for c, rs in base.records.items()}
    study = study_of([r for rs in (*short.values(), *longer.values()) for r in rs], config=base.plan.get("config"))
    frame = capacity.capacity_frame(study)
    assert sorted(frame[frame["method"] == "ar"]["max_new_tokens"]) == [24, 32]
    from specstudy.report.section_type import Section

    sec = Section("Deploy", "")
    deploy._capacity(study, sec)
    shown, _ = sec.tables["deploy_capacity"]
    assert sorted(shown["New tokens"]) == [24, 24, 32, 32]
    side = capacity.beside_ar(frame)  # each speculative row beside the AR capacity of its own length
    assert sorted(zip(side["max_new_tokens"], side["ar_capacity_rps"])) == sorted(
        zip(frame[frame["method"] == "ar"]["max_new_tokens"], frame[frame["method"] == "ar"]["capacity_rps"])
    )


def test_a_speculative_capacity_is_never_set_against_an_ar_capacity_that_is_a_bound():
    """make study-deploy, 2026-12-07 12:07: one repeat of llama.cpp's AR broke at every rate probed, its
    capacity a bound below 0.539 req/s (0 in the frame), and the report said prompt lookup's 0.827 req/s
    was "more than AR's 0 req/s"."""
    rates = {0.5: 0.02, 1.0: 0.03, 2.0: 0.06, 4.0: 0.2}
    spec = {0.5: [0.01, 0.01], 1.0: [0.02, 0.02], 2.0: [0.04, 0.07], 4.0: [0.1, 0.1]}
    frame = capacity.capacity_frame(_rate_study(rates, spec, repeats=2))
    ar = frame["method"] == "ar"
    frame.loc[ar, "repeats_never_held"], frame.loc[ar, "capacity_rps"] = 1, 0.0  # as a never-held repeat leaves it
    (row,) = capacity.beside_ar(frame).to_dict("records")
    assert row["capacity_ratio"] != row["capacity_ratio"]  # no ratio to a bound
    assert deploy.capacity_value(row, "ar_") == "< 0.5 req/s" and deploy.capacity_value(row) == "1.41 req/s"


def test_a_capacity_that_never_held_is_an_upper_bound_without_an_interval():
    """A slow machine: one repeat broke the SLO at every rate probed, so the capacity is below the lowest."""
    rates = {0.5: 0.02, 1.0: 0.03, 2.0: 0.06}
    spec = {0.5: [0.06, 0.01], 1.0: [0.07, 0.02], 2.0: [0.08, 0.07]}
    frame = capacity.capacity_frame(_rate_study(rates, spec, repeats=2)).set_index("method")
    row = frame.loc["ngram"]
    assert (
        row["repeats_never_held"] == 1
        and row["capacity_rps"] == 0.0
        and row["capacity_ci_low"] != row["capacity_ci_low"]
    )
    text = deploy.capacity_text(row)
    assert text.startswith("< 0.5 req/s") and "an upper bound: 1 of 2 repeats broke at every rate probed" in text


def test_a_capacity_that_never_broke_is_a_lower_bound_without_an_interval():
    """The second make study-deploy: vLLM's server held the SLO at 4 req/s in all 5 repeats and the
    report printed "4 req/s ([4, 4] over 5 repeats ...)", an interval around a bound."""
    rates = {0.5: 0.02, 1.0: 0.03}
    frame = capacity.capacity_frame(_rate_study(rates, {0.5: [0.01] * 5, 1.0: [0.02] * 5}, repeats=5))
    row = frame.set_index("method").loc["ngram"]
    assert (
        row["repeats_never_broke"] == 5
        and row["capacity_rps"] == 1.0
        and row["capacity_ci_low"] != row["capacity_ci_low"]
    )
    said = deploy.capacity_text(row)
    assert said.startswith("≥ 1 req/s (a lower bound: 5 of 5 repeats never broke, so no interval") and "[" not in said


def test_a_probe_whose_queue_still_grows_is_not_stationary():
    steady = [rec("c", prompt=i, start=float(i), ttft=0.1) for i in range(9)]
    growing = [rec("c", prompt=i, start=float(i), ttft=0.1 * (i + 1)) for i in range(9)]
    assert capacity.stationary(steady) is True and capacity.stationary(growing) is False
    assert capacity.stationary(steady[:5]) is None  # too few requests to tell
    # a burst: 9 arrivals within 0.8 s, each request 4 s long (vLLM at 16 req/s): a batching server takes it
    # in one go, flat TTFTs or not, and its queue never had the time to settle
    burst = [rec("c", prompt=i, start=0.1 * i, ttft=0.1, tpot=0.1, tokens=40) for i in range(9)]
    assert capacity.stationary(burst) is False
    assert capacity.stationary([rec("c", prompt=i, start=1.0 * i, ttft=0.1, tpot=0.1, tokens=40) for i in range(9)])
    study = study_of(
        [r for r in growing for r in [r]]
        and [
            rec("g", method="ar", label="AR", rate=1.0, prompt=i, start=float(i), ttft=0.1 * (i + 1)) for i in range(9)
        ]
    )
    frame = capacity.capacity_frame(study)
    assert frame["unsteady_probes"].tolist() == [1] and "1 probe(s) with a queue still growing" in deploy.capacity_text(
        frame.iloc[0]
    )


def test_bracket_and_the_next_probes_of_the_search():
    assert capacity.bracket({1.0: True, 2.0: True, 4.0: False, 8.0: True}) == (2.0, 4.0)  # the first break counts
    assert capacity.bracket({1.0: False}) == (0.0, 1.0)
    assert capacity.bracket({1.0: True, math.inf: True}) == (math.inf, math.inf)
    assert capacity.broke_below(4.0, {1.0: True, 2.0: False, 4.0: True}) == 2.0  # above the first break
    assert capacity.broke_below(2.0, {1.0: True, 2.0: False}) is None  # its own rate is not below it
    assert capacity.broke_below(4.0, {1.0: True, 2.0: None}) is None  # an empty probe breaks nothing
    assert capacity.next_rate({1.0: True, 4.0: False}) == 2.0  # the bracket halves geometrically
    assert capacity.next_rate({1.0: True, 1.1: False}) is None  # 1.1x apart: inside the search's resolution
    assert capacity.next_rate({0.8: False}, step=1.5625) == 0.512  # broke at its lowest rate: one step below
    assert capacity.next_rate({1.0: True, 2.0: True}, step=2.0) == 4.0  # never broke: one step above
    assert capacity.next_rate({1.0: True, math.inf: True}) is None  # nothing above an unlimited rate
    study = _rate_study({1.0: 0.02, 4.0: 0.2}, {1.0: [0.01], 4.0: [0.02]})
    # AR's bracket (1, 4) halves; prompt lookup held at both rates: the grid extends by its step, 4x
    assert capacity.refine_rates(study) == {"s": [2.0, 16.0]}
    narrow = _rate_study({1.0: 0.02, 1.1: 0.2}, {1.0: [0.01], 1.1: [0.02]})
    assert capacity.refine_rates(narrow) == {"s": [1.21]}  # AR's bracket is narrow; prompt lookup's grid extends
    low = _rate_study({1.0: 0.2, 1.1: 0.2}, {1.0: [0.2], 1.1: [0.2]})
    assert capacity.refine_rates(low) == {"s": [0.909]}  # both broke at the lowest rate: one step (1.1x) below


# ---- gamma per load ----------------------------------------------------------------------------


def test_robust_score_is_median_minus_scaled_mad():
    assert gamma_schedule.robust_score([1.0, 1.2, 1.4]) == pytest.approx(1.2 - 1.4826 * 0.2)
    assert gamma_schedule.robust_score([1.3, 1.3, 3.0]) == pytest.approx(1.3)  # one lucky repeat lifts nothing
    assert math.isnan(gamma_schedule.robust_score([]))


def _gamma_study(speed):
    """speed[(batch, gamma)] = per-repeat E2E speedups over a paired AR (5 prompts each)."""
    out = []
    for (b, g), reps in speed.items():
        for r, s in enumerate(reps):
            a, c = f"ar-b{b}-r{r}", f"pl-b{b}-g{g}-r{r}"
            for i in range(5):
                jitter = 1.0 + 0.01 * i
                if not any(x.cell_id == a and x.prompt_id == f"code/{i}" for x in out):
                    out.append(rec(a, method="ar", label="AR", batch=b, repeat=r, prompt=i, tpot=0.02 * jitter))
                noise = 1.0 + 0.05 * ((i * 3 + g) % 5 - 2) / 2  # the prompts' own spread: ±5 %
                out.append(
                    rec(
                        c,
                        batch=b,
                        gamma=g,
                        repeat=r,
                        base=a,
                        prompt=i,
                        tpot=0.02 * jitter * noise / s,
                        ttft=0.05 * noise / s,
                    )
                )
    return study_of(out)


def test_gamma_schedule_chooses_robustly_per_batch_and_says_when_it_cannot_separate():
    frame = gamma_schedule.gamma_schedule(
        _gamma_study(
            {
                (1, 2): [1.30, 1.31, 1.29],
                (1, 4): [1.60, 1.62, 1.58],
                (4, 2): [1.10, 1.09, 1.11],
                (4, 4): [1.50, 1.02, 1.01],  # one lucky repeat: its robust score stays low
                (8, 2): [0.90, 0.91, 0.89],
                (8, 4): [0.80, 0.81, 0.79],
            }
        )
    ).set_index("batch_size")
    assert frame.loc[1, "chosen"] == 4 and frame.loc[1, "runner_up"] == 2 and frame.loc[1, "separated"]
    assert frame.loc[4, "chosen"] == 2
    assert frame.loc[8, "chosen"] == "off" and frame.loc[8, "runner_up"] == 2
    line = deploy.schedule_lines(frame.reset_index())[0]
    assert line.startswith("llamacpp PL on code: γ 4 up to batch 1, γ 2 up to batch 4, off up to batch 8")
    # every γ's three repeat cells and their three paired AR cells
    assert all(len(c) == 9 and sum(x.startswith("ar-") for x in c) == 3 for c in frame["rests_on"])


def test_gamma_schedule_says_when_intervals_overlap():
    frame = gamma_schedule.gamma_schedule(_gamma_study({(1, 2): [1.30, 1.30, 1.30], (1, 4): [1.31, 1.31, 1.31]}))
    assert frame["chosen"].tolist() == [4] and frame["separated"].tolist() != [True]
    assert "cannot separate" in deploy.schedule_lines(frame)[0]


# ---- energy and cost -------------------------------------------------------------------------------


def test_energy_of_sums_gpu_counters_and_names_why_rapl_is_missing():
    samples = [
        {"gpu": 0, "gpu_energy_mj": 1000.0, "cpu_energy_unavailable": "no RAPL"},
        {"gpu": 1, "gpu_energy_mj": 5000.0},
        {"gpu": 0, "gpu_energy_mj": 3000.0},
        {"gpu": 1, "gpu_energy_mj": 6000.0},
    ]
    e = energy_of(samples)
    assert e["gpu_energy_j"] == pytest.approx(3.0) and e["cpu_energy_j"] is None
    assert e["cpu_energy_unavailable"] == "no RAPL"
    assert energy_of([{"gpu": 0, "gpu_energy_mj": 1.0}])["gpu_energy_j"] is None  # one sample: no delta


def test_rapl_reads_package_domains_unwraps_and_says_when_absent(tmp_path):
    pkg = tmp_path / "intel-rapl:0"
    (tmp_path / "intel-rapl:0:0").mkdir(parents=True)  # a subzone: not counted twice
    pkg.mkdir()
    (pkg / "energy_uj").write_text("900000\n")
    (pkg / "max_energy_range_uj").write_text("1000000\n")
    rapl = Rapl(str(tmp_path))
    (pkg / "energy_uj").write_text("100000\n")  # wrapped: 0.2 J later
    assert rapl.joules() == pytest.approx(0.2) and rapl.reason == ""
    gone = Rapl(str(tmp_path / "nowhere"))
    assert gone.joules() is None and "does not exist" in gone.reason


def _priced(price=2.0, tel=True, kind="gpu"):
    recs = []
    for i in range(5):
        recs.append(rec("ar", method="ar", label="AR", prompt=i, start=10.0 * i, tpot=0.04))
        recs.append(rec("pl", base="ar", prompt=i, start=10.0 * i, tpot=0.02))
    telemetry = (
        pd.DataFrame(
            [
                {"cell_id": c, "gpu": 0, "gpu_energy_mj": mj, "cpu_energy_unavailable": "no RAPL here"}
                for c, mjs in (("ar", (0.0, 84_000.0)), ("pl", (0.0, 42_000.0)))
                for mj in mjs
            ]
        )
        if tel
        else None
    )
    prof = HardwareProfile(
        "x", "X", 1.0, kind=kind, price_usd_per_hour=price, price_date="2026-05", price_source="quote"
    )
    return study_of(recs, telemetry, prof)


def test_cost_and_energy_per_token_beside_the_paired_ar(monkeypatch):
    monkeypatch.delenv(cost.PRICE_ENV, raising=False)
    row = cost.cost_energy_frame(_priced(), tpot_slo_ms=30.0).set_index("label").loc["PL"]
    assert row["gpu_j_per_token"] == pytest.approx(42.0 / 105) and row["ar_gpu_j_per_token"] == pytest.approx(
        84.0 / 105
    )
    assert row["meets_tpot_slo"] and row["tpot_p50_ms"] == pytest.approx(20.0)
    assert row["usd_per_m_tokens"] == pytest.approx(cost.usd_per_million_tokens(2.0, 1, row["tokens_per_s"]))
    assert row["ar_usd_per_m_tokens"] > row["usd_per_m_tokens"]
    assert math.isnan(row["cpu_j_per_token"])
    assert cost.usd_per_million_tokens(3.6, 2, 2.0) == pytest.approx(1e6 * 3.6 * 2 / 3600 / 2.0)
    notes = " ".join(deploy.energy_notes(cost.energy_read(_priced())))
    assert "RAPL not readable" in notes and "no RAPL here" in notes and "never estimates" in notes
    assert "NVML's total-energy counter" in notes and "idle ones included" in notes


def test_price_from_the_command_line_overrides_and_none_means_no_cost(monkeypatch):
    monkeypatch.setenv(cost.PRICE_ENV, "9")
    assert cost.price_of(_priced()).usd_per_gpu_hour == 9.0
    monkeypatch.setenv(cost.PRICE_ENV, "-1")
    with pytest.raises(ValueError, match="--price-per-hour=-1"):
        cost.price_of(_priced())
    monkeypatch.delenv(cost.PRICE_ENV)
    unpriced = _priced(price=None, tel=False)
    assert cost.cost_energy_frame(unpriced)["usd_per_m_tokens"].isna().all()
    assert "not computed" in deploy.price_note(cost.price_of(unpriced))
    assert "(no telemetry recorded a reading)" in " ".join(deploy.energy_notes(cost.energy_read(unpriced)))


def test_a_cpu_profile_is_priced_per_hour_of_the_machine_and_a_gpu_profile_per_gpu_hour(monkeypatch):
    monkeypatch.delenv(cost.PRICE_ENV, raising=False)
    gpu, cpu = (deploy.price_note(cost.price_of(_priced(kind=k))) for k in ("gpu", "cpu"))
    assert "US$ 2 per GPU-hour" in gpu and "price × GPUs / 3600" in gpu
    assert "US$ 2 per hour of the whole machine" in cpu and "GPU" not in cpu
    monkeypatch.setenv(cost.PRICE_ENV, "-1")
    with pytest.raises(ValueError, match="per hour of the whole machine"):
        cost.price_of(_priced(kind="cpu"))


def _server_study(tmp_path, name, rates, prompts):
    """An AR-only request-rate study on a (never started) OpenAI-compatible server: its config and layout."""
    import yaml

    from specstudy.config import load_study

    study = {
        "name": name,
        "models": [{"name": "m", "target": "smollm2-135m", "dtype": "float32"}],
        "methods": [{"method": "ar"}],
        "frameworks": ["openai"],
        "framework_options": {"openai": {"base_url": "http://127.0.0.1:9"}},
        "tasks": ["code"],
        "request_rates": rates,
        "prompts_per_task": prompts,
        "slo": {"tpot_ms": 50, "percentile": 90},
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"study": study}))
    return load_study("cpu", tmp_path / "s.yaml", check_tokenizers=False), StudyLayout(tmp_path / "out")


def test_the_capacity_search_adds_the_bracket_midpoint_to_its_sweep(tmp_path):
    """`specstudy run --refine-capacity`: after a sweep whose SLO broke between 1 and 4 req/s, the next
    round probes 2 req/s in that sweep (new cells in the plan; the finished ones stay done)."""

    from specstudy.commands.run_command import _refined
    from specstudy.records import Request, Sampling
    from specstudy.run.plan import expand

    cfg, layout = _server_study(tmp_path, "cap", [1, 4], 5)
    for plan in expand(cfg):
        tpot = 0.02 if plan.request_rate == 1 else 0.2  # the SLO holds at 1 req/s and breaks at 4
        recs = []
        for i in range(5):
            r = plan.cell.new_record(Request(f"code/{i}", ""), Sampling(max_new_tokens=21))
            r.output_tokens, r.first_token_s, r.end_s = 21, 0.05, 0.05 + 20 * tpot
            recs.append(plan.stamp(r))
        layout.write_part(plan.cell_id, recs)
    refined = _refined(cfg, layout)
    assert refined is not None
    new_cfg, sweeps = refined
    assert [sw.request_rates for sw in new_cfg.sweeps] == [(1.0, 2.0, 4.0)] and len(sweeps) == 1
    assert {p.request_rate for p in expand(new_cfg)} == {1.0, 2.0, 4.0}
    assert {p.cell_id for p in expand(cfg)} < {p.cell_id for p in expand(new_cfg)}  # done cells keep their ids


def test_an_unsteady_probe_is_rerun_longer_bounded_and_the_longer_one_counts(tmp_path):
    """`--refine-capacity`: a probe whose queue still grows is rerun with twice the prompts, at most
    ``LONGEST_PROBE_GROWTH`` times the configured count; the capacity then reads the longer probe and
    records that it replaced one."""

    from specstudy.analysis.study_records import load
    from specstudy.commands.run_command import _refined
    from specstudy.records import Request, Sampling
    from specstudy.run.plan import expand

    cfg, layout = _server_study(tmp_path, "steady", [1], 6)

    def serve(plans, growing):
        """A fake server's answers: TTFT growing with each request (a queue building) or flat."""
        for plan in plans:
            recs = []
            for i in range(plan.prompts):
                r = plan.cell.new_record(Request(f"code/{i}", ""), Sampling(max_new_tokens=21))
                ttft = 0.05 * (i + 1) if growing else 0.05
                r.start_epoch, r.output_tokens, r.first_token_s, r.end_s = float(i), 21, ttft, ttft + 0.4
                recs.append(plan.stamp(r))
            layout.write_part(plan.cell_id, recs)

    serve(expand(cfg), growing=True)
    assert capacity.unsteady_rates(load(layout.root)) == {("default", "openai"): ((1.0,), 6)}
    # the same growing queue under an SLO it broke: over capacity, the break stands, nothing to lengthen
    broke = capacity.study_slo(load(layout.root)).model_copy(update={"ttft_ms": 100.0})
    assert capacity.unsteady_rates(load(layout.root), broke) == {}
    new_cfg, sweeps = _refined(cfg, layout, cfg)
    assert [(sw.name, sw.request_rates, sw.prompts_per_task) for sw in new_cfg.sweeps] == [
        # it never broke: the grid extends one step (2x) above; its capacity is its lowest rate, held with a queue
        # still growing: rerun longer it may break, so the rate one step below is probed beside it
        ("default", (0.5, 1.0, 2.0), 6),
        ("default_longer12_openai", (1.0,), 12),
    ]
    assert sweeps == {"default", "default_longer12_openai"}
    serve(expand(new_cfg), growing=False)  # the longer probe reached a steady queue
    frame = capacity.capacity_frame(load(layout.root))
    assert frame["unsteady_probes"].tolist() == [0] and frame["lengthened_probes"].tolist() == [1]
    assert "1 probe(s) rerun longer" in deploy.capacity_text(frame.iloc[0])
    assert not any("_longer" in s for s in _refined(new_cfg, layout, cfg)[1])  # steady now: nothing to lengthen
    # the bound: a probe at LONGEST_PROBE_GROWTH times the configured prompts is not lengthened again
    import dataclasses

    at_bound = dataclasses.replace(cfg, sweeps=tuple(dataclasses.replace(sw, prompts_per_task=24) for sw in cfg.sweeps))
    assert capacity.LONGEST_PROBE_GROWTH == 4
    serve(expand(at_bound), growing=True)
    assert not any("_longer" in s for s in _refined(at_bound, layout, cfg)[1])


def test_only_the_rates_whose_queue_grew_are_rerun_longer_for_every_method_and_repeat(tmp_path):
    """The first make study-deploy reran its whole capacity sweep (80 cells, 21 of its 40 minutes) when
    a few probes held the SLO with a growing queue: the search now reruns that framework's methods and
    repeats at those rates only, in a sweep of its own, and the other rates keep their probes."""
    import yaml

    from specstudy.analysis.study_records import load
    from specstudy.commands.run_command import _refined
    from specstudy.config import load_study
    from specstudy.records import Request, Sampling
    from specstudy.run.plan import expand

    study = {
        "name": "rates",
        "models": [{"name": "m", "target": "smollm2-135m", "dtype": "float32"}],
        "methods": [{"method": "ar"}, {"method": "ngram", "label": "PL"}],
        "frameworks": ["openai"],
        "framework_options": {"openai": {"base_url": "http://127.0.0.1:9"}},
        "tasks": ["code"],
        "gammas": [4],
        "request_rates": [0.5, 1, 8],
        "repeats": 2,
        "prompts_per_task": 6,
    }
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"study": study}))
    cfg = load_study("cpu", tmp_path / "s.yaml", check_tokenizers=False)
    layout = StudyLayout(tmp_path / "out")
    for plan in expand(cfg):  # judged under the default SLO (p90 TPOT <= 50 ms)
        # 0.5 req/s steady; 1 req/s holds the SLO (TPOT 20 ms) while its queue grows (doubtful); 8 req/s
        # breaks it (TPOT 100 ms) with its queue growing: over capacity, not rerun
        grow, tpot = {0.5: (0.0, 0.02), 1.0: (0.05, 0.02), 8.0: (0.5, 0.1)}[plan.request_rate]
        recs = []
        for i in range(plan.prompts):
            r = plan.cell.new_record(Request(f"code/{i}", ""), Sampling(max_new_tokens=21))
            ttft = 0.05 + grow * i
            r.start_epoch, r.output_tokens, r.first_token_s, r.end_s = float(i), 21, ttft, ttft + 20 * tpot
            recs.append(plan.stamp(r))
        layout.write_part(plan.cell_id, recs)
    assert capacity.unsteady_rates(load(layout.root)) == {("default", "openai"): ((1.0,), 6)}
    new_cfg, sweeps = _refined(cfg, layout, cfg)
    assert sweeps == {"default", "default_longer12_openai"}  # the midpoint of 1..8 req/s, and the longer probes
    (longer,) = [sw for sw in new_cfg.sweeps if sw.name == "default_longer12_openai"]
    assert longer.request_rates == (1.0,) and longer.prompts_per_task == 12 and longer.frameworks == ("openai",)
    rerun = [p for p in expand(new_cfg) if set(p.sweeps) & sweeps and p.prompts == 12]
    # both methods, both repeats, one rate: 4 probes instead of the sweep's 12
    assert len(rerun) == 4 and {p.request_rate for p in rerun} == {1.0}
    assert {p.label for p in rerun} == {"ar", "PL"} and {p.cell.repeat for p in rerun} == {0, 1}


def test_only_the_probe_at_a_repeats_capacity_is_rerun_longer(tmp_path):
    """A held probe with a growing queue below the rate that decides its repeat's capacity is not rerun:
    the higher rate held too.  Held at 1 and 2 req/s, both queues growing: only 2 req/s is lengthened."""

    from specstudy.analysis.study_records import load
    from specstudy.records import Request, Sampling
    from specstudy.run.plan import expand

    cfg, layout = _server_study(tmp_path, "deciding", [1, 2], 6)
    for plan in expand(cfg):
        recs = []
        for i in range(plan.prompts):
            r = plan.cell.new_record(Request(f"code/{i}", ""), Sampling(max_new_tokens=21))
            ttft = 0.05 * (i + 1)  # a queue building in both probes
            r.start_epoch, r.output_tokens, r.first_token_s, r.end_s = float(i), 21, ttft, ttft + 0.4
            recs.append(plan.stamp(r))
        layout.write_part(plan.cell_id, recs)
    assert capacity.unsteady_rates(load(layout.root)) == {("default", "openai"): ((2.0,), 6)}
