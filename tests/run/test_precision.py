"""Precision targets: prompts are added to a cell and its baseline until the interval is narrow enough.

A stand-in backend (no model) decodes each prompt in a time fixed by the prompt, so the paired
speedup's spread across prompts, and with it the interval, is chosen by the test.
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from types import SimpleNamespace

import pytest
from support import tiny_requests, write_study

from specstudy.analysis.study_records import load
from specstudy.backends.base import Backend
from specstudy.config import ParamsError, load_study
from specstudy.layout import StudyLayout
from specstudy.report import tables
from specstudy.run.plan import expand
from specstudy.run.study_runner import run_study

STUDY = """
study:
  name: prec
  models:
    - {name: tiny, target: smollm2-135m, dtype: float64}
  methods:
    - {method: ar}
    - {method: ngram, label: Prompt lookup, options: {ngram_min: 1, ngram_max: 2}}
  frameworks: [reference]
  tasks: [code]
  gammas: [2]
  warmup: {requests: 1, max_new_tokens: 2}
  max_new_tokens: 6
  prompts_per_task: 5
  telemetry_period_s: 0.05
  sweeps:
    hardware:
      precision: {rel_half_width: TARGET, max_prompts: 13, step: 4, min_prompts: 5}
"""


class TimedBackend(Backend):
    """Latency per prompt from its id: AR 1–2 s, speculative AR / speedup where speedup = 2 × (1 ± spread)
    (``spread`` per task when a dict)."""

    framework = "reference"

    def __init__(self, spread):
        self.spreads, self.tokenizer, self.calls = spread, None, []

    def run(self, requests, sampling, cell):
        warm = all(r.prompt_id.startswith("warmup") for r in requests)
        self.calls.append((cell.method, len(requests), warm))
        for r in requests:
            h = zlib.crc32(r.prompt_id.encode()) % 1000 / 1000
            base = 1.0 + h
            spread = self.spreads[cell.task] if isinstance(self.spreads, dict) else self.spreads
            end = base if cell.method == "ar" else base / (2.0 * (1 + spread * (2 * h - 1)))
            yield cell.new_record(r, sampling, output_tokens=6, first_token_s=0.01, end_s=end, start_epoch=0.0)


def _run(tmp_path, target: float, spread, study: str = STUDY):
    cfg = load_study("cpu", write_study(tmp_path, study.replace("TARGET", str(target))))
    plans = expand(cfg)
    backend = TimedBackend(spread)
    kw = dict(factory=lambda fw, **o: backend, request_loader=tiny_requests, progress=False, log=lambda m: None)
    res = run_study(cfg, plans, StudyLayout(tmp_path / "out"), **kw)
    return cfg, plans, res, backend, kw


def _headline(tmp_path):
    _, raw = tables.hardware_table(load(tmp_path / "out"))
    return raw[raw["method"] != "ar"].iloc[0]


def _precision_cell(tmp_path):
    shown, _ = tables.hardware_table(load(tmp_path / "out"))
    return shown[shown["Method"] != "Baseline (AR)"].iloc[0]["Precision reached"]


def test_a_precise_row_stops_at_the_minimum(tmp_path):
    _, plans, res, _, _ = _run(tmp_path, target=0.10, spread=0.01)
    assert len(res) == len(plans) == 2  # no extension: ±1 % of 2× at n = 5 meets ±10 %
    row = _headline(tmp_path)
    assert row["n_prompts"] == 5 and row["speedup_precision"] <= 0.10
    assert _precision_cell(tmp_path).endswith("(target ±10 % reached)")
    assert {r["stopped"] for r in StudyLayout(tmp_path / "out").read_precision()["cells"].values()} == {"reached"}


def test_a_noisy_row_grows_until_the_cap_and_a_rerun_adds_nothing(tmp_path):
    cfg, plans, res, backend, kw = _run(tmp_path, target=0.01, spread=0.5)
    ext = [r for r in res if r.cell_id not in {p.cell_id for p in plans}]
    assert all(r.status == "done" for r in res), [r.message for r in res]
    assert len(ext) == 4  # prompts 5-8 and 9-12, each a speculative cell and its baseline
    measured = [(m, n) for m, n, warm in backend.calls if not warm]
    assert all(n == 1 for _, n in measured)  # each prompt beside its twin (paired in time)
    assert sum(m == "ar" for m, _ in measured) == sum(m != "ar" for m, _ in measured) == 5 + 4 + 4
    row = _headline(tmp_path)
    assert row["n_prompts"] == 13 and row["speedup_precision"] > 0.01  # the cap stopped it
    assert _precision_cell(tmp_path).endswith("(target ±1 % not met: prompts exhausted: 13 per task, the cap)")
    again = run_study(cfg, plans, StudyLayout(tmp_path / "out"), **kw)
    assert all(r.status == "skipped" for r in again if r.cell_id in {p.cell_id for p in plans})
    assert [r for r in again if r.status == "done"] == []


def test_distinct_prompts_are_added_not_repeats(tmp_path):
    _run(tmp_path, target=0.01, spread=0.5)
    recs = [r for rs in load(tmp_path / "out").records.values() for r in rs if r.method != "ar"]
    ids = [r.prompt_id for r in recs]
    assert len(ids) == len(set(ids)) == 13


def test_a_cap_below_the_minimum_is_refused_before_anything_loads(tmp_path):
    text = STUDY.replace("TARGET", "0.1").replace("max_prompts: 13", "max_prompts: 3")
    with pytest.raises(ParamsError, match="max_prompts=3.*>= prompts_per_task \\(5\\)"):
        load_study("cpu", write_study(tmp_path, text))


def test_the_dry_run_sizes_the_most_a_target_can_add(tmp_path):
    from specstudy.run.dryrun import duration_table
    from specstudy.run.precision import most_extensions

    cfg = load_study("cpu", write_study(tmp_path, STUDY.replace("TARGET", "0.1")))
    plans = expand(cfg)
    extra = most_extensions(cfg, plans)
    assert sorted((p.prompt_offset, p.prompts, p.is_baseline) for p in extra) == [
        (5, 4, False),
        (5, 4, True),
        (9, 4, False),
        (9, 4, True),
    ]
    from specstudy.config import load_hardware_profile

    rows = {r["sweep"]: r for r in duration_table(cfg, plans, load_hardware_profile("cpu", measure=False))}
    assert rows["precision targets: at most, if none is met (not in TOTAL)"]["requests"] == 16
    assert rows["TOTAL"]["requests"] == 10


def test_no_row_stops_on_its_interval_before_the_first_look(tmp_path):
    """A row precise at 5 prompts still grows to ``min_prompts`` (the sequential rule's coverage), then stops."""
    study = STUDY.replace("min_prompts: 5", "min_prompts: 9")
    _, plans, res, _, _ = _run(tmp_path, target=0.10, spread=0.01, study=study)
    assert len(res) == len(plans) + 2  # one chunk: prompts 6-9
    assert _headline(tmp_path)["n_prompts"] == 9
    assert _precision_cell(tmp_path).endswith("(target ±10 % reached)")


def test_a_budget_smaller_than_a_rows_next_chunk_stops_it_and_the_report_says_so(tmp_path):
    """Two rows short of ±1 %: a budget smaller than what either row's next chunk should cost (its prompts
    at the row's own cost so far) starts neither, and the report says "budget" rather than naming the cap.
    (Which row goes first when several fit: test_precision_goes_where_it_is_cheapest_then_to_the_widest.)"""
    study = STUDY.replace("tasks: [code]", "tasks: [code, chat]").replace(
        "min_prompts: 5", "min_prompts: 5, budget_s: 0.001"
    )
    cfg, plans, res, backend, kw = _run(tmp_path, target=0.01, spread={"code": 0.1, "chat": 0.5}, study=study)
    ext = [r.cell_id for r in res if r.cell_id not in {p.cell_id for p in plans}]
    assert ext == [], ext
    doc = StudyLayout(tmp_path / "out").read_precision()
    stops = {cid.split("_")[2]: row["stopped"] for cid, row in doc["cells"].items()}
    assert stops == {"code": "budget", "chat": "budget"}
    assert doc["sweeps"]["hardware"]["budget_s"] == 0.001 and doc["sweeps"]["hardware"]["spent_s"] >= 0
    assert "not met: budget:" in _precision_cell(tmp_path)
    again = run_study(cfg, plans, StudyLayout(tmp_path / "out"), **kw)  # the same budget, not a fresh one
    assert [r for r in again if r.status == "done"] == []


def test_the_cells_budget_stops_extensions_a_slower_machine_cannot_fit_and_the_report_says_so(tmp_path):
    """``cells_budget_s``: a row whose next chunk would end past the study's budget is not extended (its
    sweep's own budget unlimited), its stop is "study time" and the report names it; a generous budget
    extends as before (the same study as the cap test: 4 extension cells)."""
    for name in ("tight", "roomy"):
        (tmp_path / name).mkdir()
    tight = STUDY.replace("  telemetry_period_s: 0.05", "  telemetry_period_s: 0.05\n  cells_budget_s: 0.001")
    _, plans, res, _, _ = _run(tmp_path / "tight", target=0.01, spread=0.5, study=tight)
    assert [r for r in res if r.cell_id not in {p.cell_id for p in plans}] == []
    doc = StudyLayout(tmp_path / "tight" / "out").read_precision()
    assert {row["stopped"] for row in doc["cells"].values()} == {"study time"}
    assert doc["study_time_left_s"] == 0.0
    assert _precision_cell(tmp_path / "tight").endswith(
        "(target ±1 % not met: study time: 0 s left of the cells' budget, less than the row's next prompts cost)"
    )
    roomy = STUDY.replace("  telemetry_period_s: 0.05", "  telemetry_period_s: 0.05\n  cells_budget_s: 3600")
    _, plans, res, _, _ = _run(tmp_path / "roomy", target=0.01, spread=0.5, study=roomy)
    assert len([r for r in res if r.cell_id not in {p.cell_id for p in plans}]) == 4
    assert StudyLayout(tmp_path / "roomy" / "out").read_precision()["study_time_left_s"] > 3000


def test_shards_extend_their_own_rows_and_the_report_reads_every_shards_stops(tmp_path):
    """Two shards at once (a cluster run: each job its own rows) keep their stops apart, and the study's
    precision reads both: the rows of one shard are not lost to the other's file."""
    cfg = load_study("cpu", write_study(tmp_path, STUDY.replace("TARGET", "0.01").replace("[code]", "[code, chat]")))
    plans = expand(cfg)
    backend = TimedBackend(0.5)
    kw = dict(factory=lambda fw, **o: backend, request_loader=tiny_requests, progress=False, log=lambda m: None)
    layout = StudyLayout(tmp_path / "out")
    for shard, task in (("s0", "code"), ("s1", "chat")):
        mine = [p for p in plans if p.cell.task == task]
        res = run_study(cfg, mine, layout, full_plan=plans, shard=shard, **kw)
        assert len(res) == 2 + 4 and {r.status for r in res} == {"done"}  # 2 cells, then 2 extensions of 2
        records = layout.read_records()
        assert {records[c][0].task for c in layout.read_precision(shard)["cells"]} == {task}
    assert not layout.precision_path.exists()  # no shard wrote the study's file
    doc = layout.read_precision()
    assert {row["n_prompts"] for row in doc["cells"].values()} == {13} and len(doc["cells"]) == 2 * 3
    assert doc["sweeps"]["hardware"]["spent_s"] == pytest.approx(
        sum(layout.read_precision(s)["sweeps"]["hardware"]["spent_s"] for s in ("s0", "s1")), abs=0.01
    )
    from specstudy.report.precision_stops import stop_text

    study = load(tmp_path / "out")
    for task in ("code", "chat"):  # each shard's row reads its own stop through the study's precision
        cells = [c for c, rs in study.records.items() if rs[0].task == task and rs[0].method != "ar"]
        assert stop_text(study, cells) == "prompts exhausted: 13 per task, the cap"


def test_the_aa_control_grows_to_its_own_target_in_time_beside_the_headline_rows_extension(tmp_path):
    """``aa_precision``: the A/A control is extended like a headline row, and its chunk runs in the same
    group as the headline row's chunk of the same baseline prompts (one baseline extension, both arms
    beside it in time), not after it."""
    from specstudy.records import CONTROL_FAMILY
    from specstudy.run.paired_in_time import IN_TIME
    from specstudy.run.precision import control_sweep

    study = STUDY.replace("  telemetry_period_s: 0.05\n", "  telemetry_period_s: 0.05\n  aa_control: true\n")
    study = study.replace(
        "  sweeps:\n", "  aa_precision: {rel_half_width: 0.03, max_prompts: 9, step: 4, min_prompts: 9}\n  sweeps:\n"
    )
    cfg, plans, res, backend, _ = _run(tmp_path, target=0.01, spread=0.5, study=study)
    assert {r.status for r in res} == {"done"}
    layout = StudyLayout(tmp_path / "out")
    doc = layout.read_precision()
    (fw,) = {p.cell.framework for p in plans}
    ctl = {c: row for c, row in doc["cells"].items() if row["sweep"] == control_sweep(fw)}
    assert set(doc["sweeps"][control_sweep(fw)]) >= {"budget_s", "spent_s"}  # the control's budget, its own
    assert len(ctl) == 2 and {(row["n_prompts"], row["stopped"]) for row in ctl.values()} == {(9, "reached")}
    records = layout.read_records()
    ext = [c for c in records if c not in {p.cell_id for p in plans}]
    ctl_ext = [c for c in ext if records[c][0].family == CONTROL_FAMILY]
    head_ext = [c for c in ext if records[c][0].method == "ngram" and records[c][0].prompt_id in
                {r.prompt_id for r in records[ctl_ext[0]]}]  # fmt: skip
    assert len(ctl_ext) == 1 and head_ext
    partner = {r.extra["partner_cell_id"] for c in (ctl_ext[0], head_ext[0]) for r in records[c]}
    assert len(partner) == 1  # one baseline chunk for both
    assert all(r.extra["pairing"] == IN_TIME for r in records[ctl_ext[0]])
    measured = [m for m, n, warm in backend.calls if not warm]
    # AR and the control (5 each), then each AR chunk beside the control's
    assert measured.count("ar") == 5 + 5 + 4 + 4 + 4
    from specstudy.analysis.pairing import control_rows

    (row,) = control_rows(load(tmp_path / "out"))  # the control and its extension: one A/A row, pooled
    assert row.n_prompts == 9 and row.cell_id in {*ctl_ext, *(p.cell_id for p in plans if p.family == CONTROL_FAMILY)}
    # the Validity table states the control's target and whether it was reached (issue 49, item 4)
    from specstudy.report.validity_text import control_target, validity_section

    study = load(tmp_path / "out")
    assert control_target(study, row) == "±3 % reached"  # 9 prompts, stopped "reached" (above)
    md = validity_section(study).markdown
    assert "Precision target" in md and control_target(study, row) in md
    short = dataclasses.replace(row, half_width=0.2)  # a control short of ±3 %: what stopped it is named
    assert control_target(study, short).startswith("±3 % not met: ")


def test_aa_precision_needs_the_aa_control(tmp_path):
    study = STUDY.replace(
        "  sweeps:\n", "  aa_precision: {rel_half_width: 0.03, max_prompts: 9, step: 4, min_prompts: 9}\n  sweeps:\n"
    )
    with pytest.raises(ParamsError) as e:
        load_study("cpu", write_study(tmp_path, study.replace("TARGET", "0.1")))
    assert e.value.key == "study.aa_precision" and "aa_control: true" in str(e.value)


def test_precision_goes_where_it_is_cheapest_then_to_the_widest():
    """Two rows short of ±3 % in one sweep: the cheap one (±5 % at 5 prompts of 1 s: about 9 s from its
    target) runs before the wider, dearer one (±8 % at 5 prompts of 5 s: about 150 s) whenever it can reach
    the target within what the sweep has left; when neither can, the one whose chunk narrows its interval
    the most per second (here the widest), if its own chunk fits what is left."""
    from specstudy.run.precision import RowState, next_row

    def row(name: str, half: float, prompt_s: float, budget: float | None) -> RowState:
        target = {"rel_half_width": 0.03, "min_prompts": 5, "max_prompts": 50, "step": 5, "budget_s": budget}
        pending = (SimpleNamespace(cell_id=f"{name}-b", prompts=5), SimpleNamespace(cell_id=f"{name}-s", prompts=5))
        return RowState("aa_control", target, [name], half, 5, 5, pending, prompt_s)  # type: ignore[arg-type]

    cheap, wide = row("cheap", 0.05, 1.0, 60.0), row("wide", 0.08, 5.0, 60.0)
    assert cheap.seconds_to_target == pytest.approx(5 * ((0.05 / 0.03) ** 2 - 1) * 1.0)
    assert next_row([wide, cheap], {}, {}, set()) is cheap
    # 5 s left: the wide row's chunk (5 prompts of 5 s) does not fit, the cheap row's (5 of 1 s) does
    assert next_row([wide, cheap], {"aa_control": 55.0}, {}, set()) is cheap
    dear = row("cheap", 0.05, 20.0, 60.0)  # about 180 s from its target: out of reach; wide narrows more a second
    assert next_row([dear, wide], {}, {}, set()) is wide
    assert next_row([row("x", float("nan"), 1.0, None), cheap], {}, {}, set()) is cheap
    # the study's time left (cells_budget_s) prices the same chunks: 8 s left fits only the cheap row's 5 s,
    # and reaching a target counts only within it; 4 s fits neither, and each row's stop says so
    from specstudy.run.precision import STUDY_TIME, stop_reason

    assert next_row([wide, cheap], {}, {}, set(), time_left_s=8.0) is cheap
    assert next_row([wide, cheap], {}, {}, set(), time_left_s=4.0) is None
    assert stop_reason(cheap, {}, {}, 4.0) == STUDY_TIME and stop_reason(cheap, {}, {}, 8.0) == "not run"
    assert stop_reason(wide, {"aa_control": 55.0}, {}, 4.0) == "budget"  # the sweep's own budget first


def test_rows_out_of_reach_go_where_a_second_narrows_most_and_each_control_spends_its_own_budget():
    """make study of 2026-12-07 23:37: the three A/A controls shared one 20-s budget; the reference
    control's first chunk (±4.0 % at 5 prompts: about 13 s from ±3 %) spent 19.3 s of it and left
    llama.cpp's at ±10.3 % over 5 prompts, though a llama.cpp prompt costs 0.6 s.  Now each control has a
    budget of its own, and among rows that cannot reach their target within it, the chunk that narrows its
    interval the most per second goes first: llama.cpp's (5 prompts, 3 s), not HF's wider one (20 s)."""
    from specstudy.run.precision import RowState, control_sweep, next_row

    def control(fw: str, half: float, prompt_s: float) -> RowState:
        target = {"rel_half_width": 0.03, "min_prompts": 10, "max_prompts": 30, "step": 5, "budget_s": 20.0}
        pending = (SimpleNamespace(cell_id=f"{fw}-b", prompts=5), SimpleNamespace(cell_id=f"{fw}-s", prompts=5))
        return RowState(control_sweep(fw), target, [fw], half, 5, 5, pending, prompt_s)  # type: ignore[arg-type]

    llama, hf = control("llamacpp", 0.103, 0.6), control("hf", 0.22, 4.0)
    assert llama.seconds_to_target > 20.0 and hf.seconds_to_target > 20.0  # neither within its 20 s
    assert next_row([hf, llama], {}, {}, set()) is llama  # the widest-first rule chose hf
    assert llama.narrowing_per_s(3.0) == pytest.approx((0.103 / 0.03) * (1 - math.sqrt(0.5)) / 3.0)
    # the reference control's spend is its own: llama.cpp's budget is whole
    spent = {control_sweep("reference"): 19.3}
    assert next_row([llama], spent, {}, set()) is llama
    assert next_row([llama], {control_sweep("llamacpp"): 19.3}, {}, set()) is None  # its own 0.7 s: no chunk
    # a row with no interval yet, or no cost known, goes first
    assert control("x", float("nan"), 1.0).narrowing_per_s(5.0) == math.inf
    assert llama.narrowing_per_s(0.0) == math.inf
