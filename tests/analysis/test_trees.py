"""The tree-shape table: each tree row's shape, measured AL with its interval beside the AL its own
model expects (Sequoia's DP, a chain's i.i.d. formula), SpecInfer's per-drafter shares."""

from __future__ import annotations

import pytest
from support import code_prompt_record

from specstudy import metrics
from specstudy.analysis.study_records import load
from specstudy.layout import StudyLayout
from specstudy.records import Cell
from specstudy.report.tree_tables import EAGLE2_SHAPE, tree_shape_table

N = 6  # distinct prompts: enough for an interval (metrics.MIN_PROMPTS_FOR_CI)


def _cell(
    lay,
    cid,
    method,
    label,
    *,
    base=None,
    drafter=None,
    gamma=None,
    extra=None,
    accepted=6,
    per_pos=None,
    temperature=0.0,
):
    cell = Cell("s", "synthetic", "reference", method, "code", "m", drafter=drafter, gamma=gamma, id=cid)
    recs = []
    for i in range(N):
        spec = method != "ar"
        recs.append(
            code_prompt_record(
                cell,
                i,
                end_s=(1.0 + 0.1 * i) * (0.6 if spec else 1.0),
                temperature=temperature,
                drafted_tokens=18 if spec else None,
                accepted_tokens=accepted + (i % 2) if spec else None,
                draft_steps=6 if spec else None,
                label=label,
                family="tree" if spec else "ar",
                sweeps=["tree_shapes"],
                baseline_cell_id=base,
                extra=dict(extra or {}),
                **(per_pos or {}),
            )
        )
    lay.write_part(cid, recs)


@pytest.fixture
def study(tmp_path):
    lay = StudyLayout(tmp_path / "trees")
    _cell(lay, "ar", "ar", "AR")
    counts = {"drafts_per_position": [6, 4, 2], "accepted_per_position": [4, 2, 0]}  # 6 accepted of 12 reached
    _cell(
        lay,
        "chain",
        "tree",
        "Chain of 3",
        base="ar",
        drafter="self:15",
        gamma=3,
        extra={"tree_nodes": 4},
        per_pos=counts,
    )
    seq = {"sequoia_tree": "[[[]],[]]", "sequoia_expected_al": 2.4, "tree_nodes": 4}
    _cell(lay, "seq", "sequoia", "Sequoia", base="ar", drafter="self:15", gamma=3, extra=seq)
    # per request 6 steps: self:15's own tree matched depth 1 in 3 steps and depth 2 in 1, ngram's depth 1 in 2
    reach = {"self:15": [3, 1], "ngram": [2, 2, 1]}
    merged = {
        "drafter_tokens": {"self:15": 3, "ngram": 1},
        "tree_nodes": 6,
        "drafter_reach": reach,
        "drafter_reach_steps": 6,
    }
    _cell(lay, "spi", "specinfer", "SpecInfer", base="ar", drafter="self:15+ngram", gamma=3, extra=merged)
    eagle2 = {"tree": "eagle2_dynamic", "tree_topk": 4, "tree_nodes_budget": 6, "tree_nodes": 30}
    _cell(lay, "e2", "eagle", "EAGLE-2 tree", base="ar", drafter="e.safetensors", gamma=3, extra=eagle2)
    _cell(lay, "ec", "eagle", "EAGLE chain", base="ar", drafter="e.safetensors", gamma=3)
    return load(lay.root)


def test_each_shape_has_measured_and_expected_al(study):
    table, raw = tree_shape_table(study)
    rows = {r["Method (what ran)"]: r for r in table.to_dict("records")}
    assert set(rows) == {"Chain of 3", "Sequoia", "SpecInfer", "EAGLE-2 tree", "EAGLE chain"}
    assert rows["Sequoia"]["Seed row"] == "Sequoia" and rows["SpecInfer"]["Seed row"] == "SpecInfer"
    assert rows["Sequoia"]["Shape"] == "[[[]],[]]" and rows["Sequoia"]["AL expected (prediction)"] == "2.40"
    assert rows["Sequoia"]["Expected from"].startswith("Sequoia DP")
    # the measured AL is the pooled 1 + Σ accepted / Σ draft steps, with its interval over prompts
    acc = sum(6 + (i % 2) for i in range(N))
    want = metrics.acceptance_length(acc, 6 * N)
    got = raw.set_index("label").loc["Sequoia", "acceptance_length"]
    assert got == pytest.approx(want) and "[" in rows["Sequoia"]["AL measured"]
    # each share with the AL the drafter's own tree reached in the same steps: 1 + (3 + 1) / 6, 1 + 5 / 6
    assert rows["SpecInfer"]["Accepted per drafter"] == (
        "target's first 15 layers 75% (own AL 1.67), ngram 25% (own AL 1.83)"
    )
    assert rows["SpecInfer"]["Nodes verified / step (mean)"] == "1.0"  # 6 nodes a request over its 6 draft steps


def test_eagle_rows_are_the_seeds_eagle2_row_only_with_the_dynamic_tree(study):
    rows = {r["Method (what ran)"]: r for r in tree_shape_table(study)[0].to_dict("records")}
    assert rows["EAGLE-2 tree"]["Seed row"] == "EAGLE-2"
    assert rows["EAGLE chain"]["Seed row"] == "EAGLE-2 (chain only, no dynamic tree)"
    assert rows["EAGLE-2 tree"]["Shape"] == EAGLE2_SHAPE
    assert rows["EAGLE-2 tree"]["Nodes verified / step (mean)"] == "5.0"  # 30 nodes over 6 draft steps
    assert rows["EAGLE chain"]["Shape"] == "chain" and rows["EAGLE chain"]["Nodes verified / step (mean)"] == "3.0"
    assert rows["EAGLE-2 tree"]["Expected from"] == "no closed form for this shape"


def test_a_chain_expects_the_iid_formula_and_other_shapes_say_they_have_none(study):
    table, raw = tree_shape_table(study)
    r = raw.set_index("label")
    alpha_hat = metrics.alpha_hat([4 * N, 2 * N, 0], [6 * N, 4 * N, 2 * N])
    want = metrics.expected_acceptance_length(alpha_hat, 3)  # (1 − α̂^4) / (1 − α̂) from the row's own α̂
    assert r.loc["Chain of 3", "expected_al"] == pytest.approx(want)
    # SpecInfer: independent drafters, P(d) per drafter from its reach: 1 + Σ_d [1 − Π_i (1 − P_i(d))]
    p_self, p_ngram = [3 / 6, 1 / 6, 0.0], [2 / 6, 2 / 6, 1 / 6]
    want = 1 + sum(1 - (1 - a) * (1 - b) for a, b in zip(p_self, p_ngram))
    assert r.loc["SpecInfer", "expected_al"] == pytest.approx(want)
    rows = {row["Method (what ran)"]: row for row in table.to_dict("records")}
    assert rows["SpecInfer"]["Expected from"].startswith("independent drafters")


def test_independent_merge_is_each_drafter_alone_and_never_below_the_best_one():
    from specstudy.analysis.trees import independent_merge_al

    assert independent_merge_al({"a": [6, 3]}, 6) == pytest.approx(1 + 1 + 0.5)  # one drafter: 1 + Σ_d P(d)
    assert independent_merge_al({"a": [6, 3], "b": [0]}, 6) == pytest.approx(2.5)  # a drafter that never hits adds 0
    both = independent_merge_al({"a": [3], "b": [3]}, 6)
    assert both == pytest.approx(1 + 1 - 0.25) and both > independent_merge_al({"a": [3]}, 6)
    assert independent_merge_al({"a": [1]}, 0) != independent_merge_al({"a": [1]}, 0)  # NaN without steps


def test_specinfer_at_t_above_zero_predicts_nothing(tmp_path):
    lay = StudyLayout(tmp_path / "hot")
    _cell(lay, "ar", "ar", "AR")
    extra = {"drafter_tokens": {"ngram": 1}, "drafter_reach": {"ngram": [2]}, "drafter_reach_steps": 6}
    _cell(
        lay, "spi", "specinfer", "SpecInfer", base="ar", drafter="self:15+ngram", gamma=3, extra=extra, temperature=0.7
    )
    table, raw = tree_shape_table(load(lay.root))
    assert raw.loc[0, "expected_al"] != raw.loc[0, "expected_al"]
    assert table.loc[0, "Expected from"] == "independent drafters: greedy rows only"
