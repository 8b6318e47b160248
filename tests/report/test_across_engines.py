"""The same drafter in several engines: each engine's α and AL over the same prompts, and a verdict
from the AL intervals (disjoint: a difference beyond noise; overlapping: not resolved)."""

from __future__ import annotations

import pytest
from support import code_prompt_record

from specstudy.analysis.study import load
from specstudy.layout import StudyLayout
from specstudy.records import Cell
from specstudy.report.across_engines import AGREE, acceptance_across_engines

N = 6  # distinct prompts (an interval needs 5)


def _cell(lay, fw, method, *, base=None, gamma=None, accepted=(6, 7), label=None, batch=1):
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
                drafted_tokens=24 if spec else None,
                accepted_tokens=accepted[i % 2] if spec else None,
                draft_steps=6 if spec else None,
                label=label or method,
                family="heads" if spec else "ar",
                sweeps=["frameworks"],
                baseline_cell_id=base,
            )
        )
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
    said = table["Across engines"].iloc[0]
    # reference and vllm overlap (1.0-1.2 per step), vllm-server accepts ~3 per step: disjoint from both
    assert said.startswith("differ beyond noise") and "reference below vllm-server" in said
    assert "vllm below vllm-server" in said and "reference below vllm;" not in said


def test_engines_that_agree_are_said_to(tmp_path):
    lay = StudyLayout(tmp_path / "agree")
    for fw in ("reference", "vllm"):
        base = _cell(lay, fw, "ar")
        _cell(lay, fw, "eagle3", base=base, gamma=4, label="EAGLE-3")
    table, _ = acceptance_across_engines(load(lay.root))
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
    assert set(table["Across engines"]) == {AGREE}  # reference and vllm overlap
