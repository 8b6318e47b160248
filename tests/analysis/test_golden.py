"""The acceptance regression gate: a rerun of the same study passes, a planted drafter change fails."""

from __future__ import annotations

import json

import pytest
from support import TINY_STUDY, TinyFactory, run_tiny_study, write_study

from specstudy.analysis.golden import acceptance_rows, compare, golden_doc
from specstudy.analysis.study_records import load
from specstudy.cli import main
from specstudy.config import load_study
from specstudy.engine.methods import layer_skip
from specstudy.report.gate import moved_text
from specstudy.run.plan import expand

GATE_STUDY = TINY_STUDY.replace("batch_sizes: [1, 2]", "batch_sizes: [1]")


def _run(tmp_path, name, text=GATE_STUDY):
    cfg = load_study("cpu", write_study(tmp_path, text, f"{name}.yaml"))
    out = tmp_path / name / "cpu"
    res = run_tiny_study(cfg, expand(cfg), out, TinyFactory())
    assert all(r.status == "done" for r in res), [r.message for r in res]
    return out


@pytest.fixture(scope="module")
def studies(tmp_path_factory):
    """The same tiny study twice, then once with the early-exit drafter "retrained": a planted adapter
    (a fixed random linear map) between its exit layer and the LM head, the label unchanged."""
    import torch

    tmp = tmp_path_factory.mktemp("gate")
    first, rerun = _run(tmp, "first"), _run(tmp, "rerun")
    grown = _run(tmp, "grown", GATE_STUDY.replace("prompts_per_task: 2", "prompts_per_task: 3"))
    real = layer_skip.early_exit_draft

    def retrained(target, options, device):
        torch.manual_seed(1)
        adapter = torch.nn.Linear(target.config.hidden_size, target.config.hidden_size, dtype=torch.float64)
        return real(target, {**options, "adapter": adapter}, device)

    mp = pytest.MonkeyPatch()
    mp.setattr(layer_skip, "early_exit_draft", retrained)
    try:
        planted = _run(tmp, "planted")
    finally:
        mp.undo()
    return tmp, first, rerun, planted, grown


def test_exact_golden_passes_a_rerun_and_fails_a_planted_drafter_change(studies, capsys):
    tmp, first, rerun, planted, grown = studies
    golden = tmp / "golden.json"
    assert main(["check", "--write-golden", str(golden), str(first), "--rel-tol", "0"]) == 0
    doc = json.loads(golden.read_text())
    assert doc["rel_tol"] == 0 and any("Early exit" in k for k in doc["rows"])
    assert main(["check", "--golden", str(golden), str(rerun)]) == 0
    # a row a precision target grew holds more prompts: compared on the prompts both measured, it passes
    assert main(["check", "--golden", str(golden), str(grown)]) == 0
    capsys.readouterr()
    assert main(["check", "--golden", str(golden), str(planted)]) == 1
    out = capsys.readouterr().out
    moved = [line for line in out.splitlines() if line.startswith("MOVED")]
    assert moved and all("label=Early exit" in line for line in moved), out
    assert not any("label=Prompt lookup" in line for line in moved)  # its drafter did not change


def test_tolerance_is_relative_per_position():
    row = {"acceptance_length": 2.0, "alpha": 0.5, "per_position": [0.8, 0.4], "requests": 4}
    golden = {"version": 1, "rel_tol": 0.05, "rows": {"r": row}}
    near = {"r": {**row, "per_position": [0.82, 0.41]}}  # 2.5 % each: inside 5 %
    far = {"r": {**row, "per_position": [0.8, 0.43]}}  # position 2 moved 7.5 %
    assert compare(golden, near) == []
    assert [moved_text(m) for m in compare(golden, far)] == ["position 2 acceptance 0.4 -> 0.43"]
    assert compare(golden, far, rel_tol=0.1) == []
    assert [moved_text(m) for m in compare(golden, {})] == ["row missing from the study"]
    assert moved_text(compare(golden, {"r": {**row, "per_position": [0.8]}})[0]) == "per-position depth 2 -> 1"


def test_rows_with_per_prompt_counts_compare_on_the_prompts_both_measured():
    a = {"accepted": 3, "drafted": 4, "draft_steps": 2, "accepted_per_position": [2, 1]}
    b = {"accepted": 0, "drafted": 4, "draft_steps": 2, "accepted_per_position": [0, 0]}
    row = {"acceptance_length": 2.5, "alpha": 0.75, "per_position": [1.0, 0.5], "prompts": {"p1": a}}
    golden = {"version": 1, "rel_tol": 0.0, "rows": {"r": row}}
    grown = {
        "r": {"acceptance_length": 1.75, "alpha": 0.375, "per_position": [0.5, 0.25], "prompts": {"p1": a, "p2": b}}
    }
    assert compare(golden, grown) == []  # p2 is new: only p1 is compared, and it did not move
    moved = {"r": {**grown["r"], "prompts": {"p1": b}}}
    assert {moved_text(m) for m in compare(golden, moved)} >= {
        "acceptance_length 2.5 -> 1.0",
        "position 1 acceptance 1.0 -> 0.0",
    }
    elsewhere = {"r": {**grown["r"], "prompts": {"p9": a}}}
    assert [moved_text(m) for m in compare(golden, elsewhere)] == ["no prompt in common with the golden"]


def test_rows_pool_repeats_and_skip_ar(studies):
    first = studies[1]
    rows = acceptance_rows(load(first))
    assert rows and not any('"label": "ar"' in k for k in rows)
    drafted = [r for r in rows.values() if r["acceptance_length"] is not None]
    assert drafted and all(1.0 <= r["acceptance_length"] <= 3.0 and len(r["per_position"]) == 2 for r in drafted)
    # a row that drafted nothing stays in the golden (None): drafting there later is a move
    assert compare(golden_doc(load(first), rows, 0.0), {k: {**r, "alpha": 0.5, "prompts": {}} for k, r in rows.items()})


def test_bad_input_is_named(studies, tmp_path, capsys):
    first = studies[1]
    assert main(["check", "--golden", str(tmp_path / "g.json"), str(tmp_path / "nowhere")]) == 2
    assert "OUTPUTS=" in capsys.readouterr().err
    golden = tmp_path / "g.json"
    golden.write_text(json.dumps(golden_doc(load(first), {}, 0.05) | {"version": 9}))
    assert main(["check", "--golden", str(golden), str(first)]) == 2
    assert "golden version=9" in capsys.readouterr().err
    assert main(["check", "--golden", str(golden), str(first), "--rel-tol", "2"]) == 2


def test_an_exact_golden_is_checked_exactly_on_its_machine_kind_and_at_five_percent_on_another():
    from specstudy.analysis.golden import CROSS_MACHINE_REL_TOL, tolerance_for

    EPYC = {"cpu_model": "AMD EPYC", "cpu_cores_logical": 2, "gpus": []}
    XEON = {"cpu_model": "Intel Xeon", "cpu_cores_logical": 16, "gpus": []}
    row = {"acceptance_length": 3.0, "alpha": 0.5, "per_position": [0.8, 0.4]}
    golden = {"version": 1, "rel_tol": 0.0, "machine": EPYC, "rows": {"r": row}}
    near = {"r": {**row, "per_position": [0.8, 0.41]}}  # one position 2.5 % off: a near-tie flip elsewhere
    far = {"r": {**row, "per_position": [0.8, 0.3]}}  # 25 % off: a drafter that changed
    assert [m.position for m in compare(golden, near, machine=EPYC)] == [2]  # same kind: exact
    assert compare(golden, near, machine=XEON) == []  # another kind: within 5 %
    assert [m.position for m in compare(golden, far, machine=XEON)] == [2]
    assert tolerance_for(golden, XEON) == CROSS_MACHINE_REL_TOL == 0.05
    assert tolerance_for(golden, {}) == 0.0 and tolerance_for({"rel_tol": 0.0}, XEON) == 0.0
    assert tolerance_for(golden, XEON, rel_tol=0.0) == 0.0  # --rel-tol wins


def test_rows_whose_drafting_reads_the_clock_are_left_out(studies):
    """Cost-aware γ drafted differently in two quiet `make study` runs (its γ comes from timed
    forwards): such a row cannot be gated exactly; the runner stamps the options the gate reads."""
    from specstudy.analysis.golden import drafting_reads_the_clock

    study = load(studies[1])
    rows = acceptance_rows(study)
    cid, meta = next((c, m) for c, m in study.cells.items() if m["method"] != "ar")
    assert "method_options" in (study.records[cid][0].extra or {})
    for r in study.records[cid]:
        r.extra = {**r.extra, "method_options": {"dynamic_gamma": "cost"}}
    left = acceptance_rows(study)
    assert len(left) == len(rows) - 1
    assert drafting_reads_the_clock("sequoia", {}) and not drafting_reads_the_clock(
        "sequoia", {"sequoia_choose": "tokens"}
    )
    assert not drafting_reads_the_clock("sequoia", {"sequoia_cost": "1,1.1"}) and not drafting_reads_the_clock(
        "ngram", {}
    )
