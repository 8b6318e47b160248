"""Tidy frames the notebooks explore: fixed columns even when empty, and the entropy of a task
taken from another AR record of the same prompt when an engine's baseline has none (llama.cpp)."""

from __future__ import annotations

import dataclasses

from specstudy.analysis import frames
from specstudy.analysis.study_records import load


def test_entropy_points_keep_their_columns_when_nothing_matches(report_study):
    pts = frames.entropy_points(load(report_study), ["no-such-task"])
    assert len(pts) == 0 and list(pts.columns) == frames.ENTROPY_COLUMNS


def test_entropy_from_another_ar_record_when_the_baseline_has_none(report_study):
    study = load(report_study)
    paired = frames.entropy_points(study)
    assert len(paired) and set(paired["entropy_source"]) == {"paired AR"}
    spec = next(
        c for c in study.records if study.meta(c)["method"] != "ar" and any(r.drafted_tokens for r in study.records[c])
    )
    base = study.meta(spec)["baseline_cell_id"]
    # a baseline without logits (as llama.cpp's) and a second AR cell of the same prompts that has them
    study.records["other-ar"] = list(study.records[base])
    study.cells["other-ar"] = {**study.meta(base), "cell_id": "other-ar", "framework": "reference"}
    study.records[base] = [dataclasses.replace(r, token_entropy=None) for r in study.records[base]]
    mine = frames.entropy_points(study)
    rows = mine[mine["label"] == study.meta(spec)["label"]]
    assert len(rows) and (rows["entropy_source"] == "same prompt").any()
    assert set(rows.loc[rows["entropy_source"] == "same prompt", "entropy_framework"]) == {"reference"}
    assert (mine["entropy"] > 0).all()
    # without any AR record holding entropy for those prompts the points are dropped, not invented
    study.records["other-ar"] = [dataclasses.replace(r, token_entropy=None) for r in study.records["other-ar"]]
    assert len(frames.entropy_points(study)) < len(mine)
