"""The same drafter in several engines: each engine's α and AL over the same prompts, and a verdict:
at greedy exact and paired, prompt by prompt (the same accepted tokens, drafting that differs only
where an engine caps its drafts at the output's end, or a difference named); at T > 0 from the AL
intervals (disjoint: a difference beyond noise; overlapping: not resolved)."""

from __future__ import annotations

import pytest
from support import code_prompt_record

from specstudy.analysis.study_records import load
from specstudy.layout import StudyLayout
from specstudy.records import Cell
from specstudy.report.across_engines import AGREE, AT_END, IDENTICAL, acceptance_across_engines

N = 6  # distinct prompts (an interval needs 5)


def _cell(
    lay,
    fw,
    method,
    *,
    base=None,
    gamma=None,
    accepted=(6, 7),
    label=None,
    batch=1,
    drafted=(24,) * N,
    steps=(6,) * N,
    temperature=0.0,
    outputs=None,
    per_pos=None,
):
    cid = f"{fw}_{method}_{gamma}_{batch}"
    cell = Cell(
        "s",
        "cpu",
        fw,
        method,
        "code",
        "m",
        drafter="eagle3" if method != "ar" else None,
        gamma=gamma,
        batch_size=batch,
        id=cid,
    )
    recs = []
    for i in range(N):
        spec = method != "ar"
        recs.append(
            code_prompt_record(
                cell,
                i,
                end_s=1.0 + 0.1 * i,
                temperature=temperature,
                drafted_tokens=drafted[i] if spec else None,
                accepted_tokens=accepted[i % len(accepted)] if spec else None,
                draft_steps=steps[i] if spec else None,
                label=label or method,
                family="heads" if spec else "ar",
                sweeps=["frameworks"],
                baseline_cell_id=base,
                **(per_pos if spec and per_pos else {}),
            )
        )
        if outputs and spec:
            recs[-1].output_ids = outputs[i]
    lay.write_part(cid, recs)
    return cid


@pytest.fixture
def study(tmp_path):
    lay = StudyLayout(tmp_path / "engines")
    for fw, acc in (("reference", (6, 7)), ("vllm", (6, 8)), ("vllm-server", (18, 19))):
        base = _cell(lay, fw, "ar")
        _cell(lay, fw, "eagle3", base=base, gamma=4, accepted=acc, label="EAGLE-3")
    base = _cell(lay, "hf", "ar")
    _cell(lay, "hf", "ngram", base=base, gamma=4, label="Prompt lookup")  # on one engine only: no group
    b8 = _cell(lay, "vllm", "ar", batch=8)
    _cell(lay, "vllm", "eagle3", base=b8, gamma=4, label="EAGLE-3", batch=8)  # batch 8 is not compared
    return load(lay.root)


def test_one_row_per_engine_of_a_shared_method_and_disjoint_intervals_named(study):
    table, raw = acceptance_across_engines(study)
    assert list(table["Framework"]) == ["reference", "vllm", "vllm-server"]
    assert set(table["Method"]) == {"EAGLE-3"} and set(raw["n_prompts"]) == {N}
    al = raw.set_index("framework")["acceptance_length"]
    assert al["reference"] == pytest.approx(1 + (3 * 6 + 3 * 7) / (6 * N))
    said = raw["interval_verdict"].iloc[0]
    # reference and vllm overlap (1.0-1.2 per step), vllm-server accepts ~3 per step: disjoint from both
    assert said.startswith("differ beyond noise") and "reference below vllm-server" in said
    assert "vllm below vllm-server" in said and "reference below vllm;" not in said


def test_at_greedy_the_verdict_is_paired_and_names_each_differing_pair(study):
    table, _ = acceptance_across_engines(study)
    said = table["Across engines"].iloc[0]
    # reference accepts 6, 7, 6, 7, ... and vllm 6, 8, 6, 8, ...: three prompts differ by one token
    assert "acceptance differs on 3 of 6 prompts: reference 39 accepted, 144 drafted in 36 steps, vllm 42" in said
    assert "reference and vllm-server" not in said  # counts only, no output mismatch planted
    assert said.count("acceptance differs on 6 of 6 prompts") == 2  # vllm-server against each


def _two_engines(tmp_path, name, temperature=0.0, ref_steps=None, ref_acc=None, **vllm):
    lay = StudyLayout(tmp_path / name)
    ref = {"steps": (ref_steps,) * N, "accepted": (ref_acc,), "drafted": (46,) * N} if ref_steps else {}
    for fw, kw in (("reference", ref), ("vllm", vllm)):
        base = _cell(lay, fw, "ar", temperature=temperature)
        _cell(lay, fw, "eagle3", base=base, gamma=4, label="EAGLE-3", temperature=temperature, **kw)
    return acceptance_across_engines(load(lay.root))


def test_engines_that_agree_exactly_are_said_to(tmp_path):
    table, raw = _two_engines(tmp_path, "same")
    assert set(table["Across engines"]) == {IDENTICAL} and set(raw["interval_verdict"]) == {AGREE}


def test_drafting_that_differs_only_at_the_end_is_named_so(tmp_path):
    # vllm always drafts γ = 4: up to 4·5/2 = 10 more drafted tokens and one more step per prompt
    table, _ = _two_engines(tmp_path, "end", drafted=(34, 24, 30, 24, 25, 24), steps=(7, 6, 6, 6, 7, 6))
    said = table["Across engines"].iloc[0]
    assert said.startswith(AT_END) and "vllm 39 accepted, 161 drafted in 38 steps" in said


def test_drafting_beyond_the_end_is_not_excused(tmp_path):
    table, _ = _two_engines(tmp_path, "beyond", drafted=(35, 24, 24, 24, 24, 24), steps=(6,) * N)
    assert table["Across engines"].iloc[0].startswith("identical acceptance; drafting differs beyond the end")
    table, _ = _two_engines(tmp_path, "steps", steps=(8, 6, 6, 6, 6, 6))
    assert "beyond the end" in table["Across engines"].iloc[0]


def test_one_token_on_one_prompt_is_seen_where_the_intervals_overlap(tmp_path):
    """The issue's case: a difference far inside the noise of the intervals is still a difference."""
    table, raw = _two_engines(tmp_path, "one", accepted=(6, 7, 6, 7, 6, 8))
    assert set(raw["interval_verdict"]) == {AGREE}
    assert table["Across engines"].iloc[0].startswith("acceptance differs on 1 of 6 prompts")


def test_greedy_outputs_that_differ_are_named(tmp_path):
    outs = [list(range(32))] * 5 + [list(range(31)) + [99]]
    table, _ = _two_engines(tmp_path, "outs", outputs=outs)
    assert table["Across engines"].iloc[0] == "greedy outputs of reference and vllm differ on 1 of 6 prompts"


def test_per_position_acceptance_is_shown_per_engine(tmp_path):
    lay = StudyLayout(tmp_path / "pp")
    counts = {"reference": [6, 3, 1, 0], "vllm": [6, 2, 1, 0]}
    for fw, acc in counts.items():
        base = _cell(lay, fw, "ar")
        pp = {"accepted_per_position": acc, "drafts_per_position": [6, 6, 6, 6]}
        _cell(lay, fw, "eagle3", base=base, gamma=4, label="EAGLE-3", per_pos=pp)
    table, _ = acceptance_across_engines(load(lay.root))
    pp = dict(zip(table["Framework"], table["Per-position acceptance (conditional)"]))
    # accepted at k / reached k, position k reached when k − 1 was accepted: 3/6, 1/3 against 2/6, 1/2
    assert pp == {"reference": "1.00, 0.50, 0.33, 0.00", "vllm": "1.00, 0.33, 0.50, 0.00"}


def test_an_engine_that_returns_no_token_ids_is_not_said_to_differ(tmp_path):
    table, _ = _two_engines(tmp_path, "noids", outputs=[[]] * N)
    assert set(table["Across engines"]) == {IDENTICAL}


def test_sampled_rows_fall_back_to_the_intervals(tmp_path):
    table, _ = _two_engines(tmp_path, "t07", temperature=0.7, accepted=(6, 7, 6, 7, 6, 8))
    assert set(table["Across engines"]) == {AGREE}


@pytest.mark.validity
def test_a_flagged_engine_is_marked_and_left_out_of_the_across_engines_verdict(tmp_path):
    """vllm-server's acceptance differs (disjoint intervals), but its baseline ran on a busy machine:
    its row is marked and the verdict compares the two engines left."""
    lay = StudyLayout(tmp_path / "flagged")
    for fw, acc in (("reference", (6, 7)), ("vllm", (6, 8)), ("vllm-server", (18, 19))):
        base = _cell(lay, fw, "ar")
        _cell(lay, fw, "eagle3", base=base, gamma=4, accepted=acc, label="EAGLE-3")
    recs = lay.read_part("vllm-server_ar_None_1")
    for r in recs:
        r.extra.update(tel_cpu_cores=2, tel_load_1m_mean=4.1)
    lay.write_part("vllm-server_ar_None_1", recs)
    table, _ = acceptance_across_engines(load(lay.root))
    assert list(table["Method"]) == ["EAGLE-3", "EAGLE-3", "EAGLE-3 ⚑"]
    (said,) = set(table["Across engines"])  # one verdict for the group, from reference and vllm only
    assert "reference" in said and "vllm" in said and "vllm-server" not in said


def test_drafts_accepted_past_the_outputs_end_are_not_a_difference(tmp_path):
    """vLLM's counters count a last step's accepted drafts before max_tokens trims them (its scheduler
    records the stats first): the live engines study read 119 accepted against the reference's 112 on
    the same outputs, 7 of them past the end.  32 output tokens = 31 decoded: the reference decodes
    them in 12 draft steps accepting 18 and one step that drafts nothing (one token left); vLLM always
    drafts, 13 steps accepting 21, 3 of them past the end."""
    table, _ = _two_engines(
        tmp_path, "past", accepted=(21,), steps=(13,) * N, drafted=(52,) * N, ref_steps=12, ref_acc=18
    )
    said = table["Across engines"].iloc[0]
    assert (
        said.startswith(AT_END) and "accepted past the output's end, counted by the engine's counters: vllm 18" in said
    )
    # one step fewer is one more token accepted inside the output: a difference, past-end counts or not
    table, _ = _two_engines(
        tmp_path, "fewer", accepted=(21,), steps=(12,) + (13,) * (N - 1), drafted=(52,) * N, ref_steps=12, ref_acc=18
    )
    assert table["Across engines"].iloc[0].startswith("acceptance differs on 1 of 6 prompts")
