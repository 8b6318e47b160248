"""The tree-shape table: each tree row's shape, measured AL with its interval beside the AL its own
model expects (Sequoia's DP, a chain's i.i.d. formula), SpecInfer's per-drafter shares."""

from __future__ import annotations

import pytest

from specstudy import metrics
from specstudy.analysis.study import load
from specstudy.analysis.trees import tree_shape_table
from specstudy.layout import StudyLayout
from specstudy.records import Cell, Request, Sampling

N = 6  # distinct prompts: enough for an interval (metrics.MIN_PROMPTS_FOR_CI)


def _cell(lay, cid, method, label, *, base=None, drafter=None, gamma=None, extra=None, accepted=6, per_pos=None):
    cell = Cell("s", "synthetic", "reference", method, "code", "m", drafter=drafter, gamma=gamma, id=cid)
    recs = []
    for i in range(N):
        spec = method != "ar"
        recs.append(
            cell.new_record(
                Request(f"code/{i}", ""),
                Sampling(max_new_tokens=32),
                output_tokens=32,
                first_token_s=0.05,
                end_s=(1.0 + 0.1 * i) * (0.6 if spec else 1.0),
                start_epoch=1000.0 + 100 * i,
                output_ids=list(range(32)),
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
    merged = {"drafter_tokens": {"self:15": 3, "ngram": 1}, "tree_nodes": 6}
    _cell(lay, "spi", "specinfer", "SpecInfer", base="ar", drafter="self:15+ngram", gamma=3, extra=merged)
    return load(lay.root)


def test_each_shape_has_measured_and_expected_al(study):
    table, raw = tree_shape_table(study)
    rows = {r["Method (what ran)"]: r for r in table.to_dict("records")}
    assert set(rows) == {"Chain of 3", "Sequoia", "SpecInfer"}
    assert rows["Sequoia"]["Seed row"] == "Sequoia" and rows["SpecInfer"]["Seed row"] == "SpecInfer"
    assert rows["Sequoia"]["Shape"] == "[[[]],[]]" and rows["Sequoia"]["AL expected (prediction)"] == "2.40"
    assert rows["Sequoia"]["Expected from"].startswith("Sequoia DP")
    # the measured AL is the pooled 1 + Σ accepted / Σ draft steps, with its interval over prompts
    acc = sum(6 + (i % 2) for i in range(N))
    want = metrics.acceptance_length(acc, 6 * N)
    got = raw.set_index("label").loc["Sequoia", "acceptance_length"]
    assert got == pytest.approx(want) and "[" in rows["Sequoia"]["AL measured"]
    assert rows["SpecInfer"]["Accepted per drafter"] == "target's first 15 layers 75%, ngram 25%"
    assert rows["SpecInfer"]["Nodes verified / step (mean)"] == "1.0"  # 6 nodes a request over its 6 draft steps


def test_a_chain_expects_the_iid_formula_and_other_shapes_say_they_have_none(study):
    table, raw = tree_shape_table(study)
    r = raw.set_index("label")
    alpha_hat = metrics.alpha_hat([4 * N, 2 * N, 0], [6 * N, 4 * N, 2 * N])
    want = metrics.expected_acceptance_length(alpha_hat, 3)  # (1 − α̂^4) / (1 − α̂) from the row's own α̂
    assert r.loc["Chain of 3", "expected_al"] == pytest.approx(want)
    assert r.loc["SpecInfer", "expected_al"] != r.loc["SpecInfer", "expected_al"]  # NaN: no closed form
