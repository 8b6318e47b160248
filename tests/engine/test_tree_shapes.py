"""SpecInfer's merged multi-drafter trees and Sequoia's DP trees (issue 23).

* greedy: ``specinfer`` (two LM drafters + n-gram lookup, merged) and ``sequoia`` (given and
  measured calibration) return exactly the ``ar`` tokens on tiny random float64 models; every
  accepted token is credited to one drafter.
* sampling: the first K tokens of both follow the target's exactly computed joint distribution
  (chi-square, significance 0.001, fixed seeds); the without-replacement rule is also checked
  on one node against a negative control (the draws tested against q itself, not q with the
  earlier draws removed), which the same test rejects.
* the DP: its value equals the tree's expected tokens, it matches brute force over every tree
  of up to 6 nodes, and the chosen tree changes when the cost curve does.
"""

import itertools
from dataclasses import replace

import pytest
import torch
from exact_distribution import chi_square_p
from exact_distribution import exact_joint as _exact_joint

from specstudy.data.model_files import tiny_model
from specstudy.drafter_names import merged_parts
from specstudy.engine.methods import DecodeJob, get_method
from specstudy.engine.methods.sequoia import SequoiaDrafter
from specstudy.engine.methods.specinfer import Drafters
from specstudy.engine.proposals import ProposalTree, accept_proposals
from specstudy.engine.sequoia_calibration import draws_without_replacement
from specstudy.engine.sequoia_dp import Topology, best_trees, choose_tree, expected_tokens
from specstudy.records import Sampling

torch.set_num_threads(1)
SIGNIFICANCE = 1e-3
PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 3, 11, 3, 11, 3, 40, 41]]


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=1, num_layers=3, logit_scale=4.0)


def _run(method, target, prompt, sampling, drafter, gamma=3, **options):
    spec = get_method(method)
    opts = spec.check(gamma, 1, "self" if method == "sequoia" else "ngram", options)
    return spec.decode(DecodeJob(target, [prompt], sampling, gamma=gamma, drafter=drafter, options=opts))[0]


def _merged(target, other):
    from specstudy.engine.methods.layer_skip import early_exit_draft

    return Drafters(
        ["self:2", "other", "ngram"],
        ["lm", "lm", "ngram"],
        [early_exit_draft(target, {"exit_layer": 2}, "cpu"), other, None],
    )


# --------------------------------------------------------------------------------------------
# greedy: lossless


def test_specinfer_greedy_equals_ar_and_credits_every_accepted_token(target):
    s = Sampling(temperature=0.0, max_new_tokens=24)
    other = tiny_model(seed=5, num_layers=1, logit_scale=4.0)
    for p in PROMPTS:
        ref = get_method("ar").decode(DecodeJob(target, [p], s))[0].output_ids
        row = _run("specinfer", target, p, s, _merged(target, other), tree_branching="2,1,1")
        assert row.output_ids == ref
        shares = row.notes["drafter_tokens"]
        assert set(shares) == {"self:2", "other", "ngram"}
        assert sum(shares.values()) == sum(st.accepted for st in row.steps)
    # the repeating prompt: prompt lookup is credited with accepted tokens
    row = _run("specinfer", target, PROMPTS[2], s, _merged(target, other))
    assert sum(row.notes["drafter_tokens"].values()) > 0


def test_specinfer_records_how_deep_each_drafters_own_tree_matched(target):
    """Greedy: per step, drafter i's reach is the common prefix of its own tree with the accepted
    path, so the deepest drafter's reach is the step's accepted count and the steps counted are the
    draft steps; a drafter alone reaching depth d in a step also reached every depth below it."""
    s = Sampling(temperature=0.0, max_new_tokens=24)
    other = tiny_model(seed=5, num_layers=1, logit_scale=4.0)
    row = _run("specinfer", target, PROMPTS[2], s, _merged(target, other), tree_branching="2,1,1")
    reach, steps = row.notes["drafter_reach"], row.notes["drafter_reach_steps"]
    assert set(reach) == {"self:2", "other", "ngram"} and steps == len(row.steps) - 1  # steps[0]: the prefill
    for counts in reach.values():
        assert len(counts) <= 3 and all(a >= b for a, b in zip(counts, counts[1:]))
    accepted = [st.accepted for st in row.steps]
    # the merged tree accepts at least as deep as any one drafter, and some drafter reached every accepted depth
    union = [sum(1 for a in accepted if a > d) for d in range(3)]
    for d in range(3):
        assert max(c[d] if d < len(c) else 0 for c in reach.values()) <= union[d]
    assert sum(union) == sum(accepted) > 0


def test_prompt_lookup_in_a_merge_drafts_no_deeper_than_the_trees(target):
    """The matched budget: prompt lookup's chain is cut at γ like the other drafters' trees (it had
    drafted up to the tokens left, 12-14 nodes a step in the default study's γ 3 row)."""
    s = Sampling(temperature=0.0, max_new_tokens=24)
    only_lookup = Drafters(["ngram"], ["ngram"], [None])
    row = _run("specinfer", target, PROMPTS[2], s, only_lookup, gamma=2)  # the repeating prompt
    drafting = [st for st in row.steps if st.drafted]
    assert drafting and all(st.drafted <= 2 for st in drafting)
    assert row.tree_nodes <= 2 * len(drafting)


def test_specinfer_merges_shared_prefixes(target):
    """Two copies of the same drafter propose the same chain: one node per token, two proposals."""
    from specstudy.engine.methods.specinfer import build_drafter

    s = Sampling(temperature=0.0, max_new_tokens=8)
    same = tiny_model(seed=5, num_layers=1, logit_scale=4.0)
    job = DecodeJob(target, [PROMPTS[0]], s, gamma=3, drafter=None, options={})
    merged = build_drafter(job, Drafters(["a", "b"], ["lm", "lm"], [same, same]))
    tree = merged.propose(PROMPTS[0], 6, 3, None)
    assert len(tree) == 4  # root + one shared chain of 3
    assert all(len(props) == 2 for props in tree.proposals.values())
    assert tree.sources(1) == [0, 1]


def test_sequoia_greedy_equals_ar_given_and_measured(target):
    from specstudy.engine.methods.layer_skip import early_exit_draft

    s = Sampling(temperature=0.0, max_new_tokens=24)
    for p in PROMPTS:
        ref = get_method("ar").decode(DecodeJob(target, [p], s))[0].output_ids
        given = SequoiaDrafter("self:2", early_exit_draft(target, {"exit_layer": 2}, "cpu"))
        row = _run(
            "sequoia",
            target,
            p,
            s,
            given,
            tree_nodes=6,
            sequoia_acceptance="0.5,0.2,0.1",
            sequoia_cost="1:1,8:1",
            sequoia_draft_cost=0,
        )
        assert row.output_ids == ref
        assert row.notes["sequoia_nodes"] == 6 and row.notes["sequoia_tree"].count("[") == 7
        assert row.tree_nodes <= 6 * (len(row.steps) - 1)
        measured = SequoiaDrafter("self:2", early_exit_draft(target, {"exit_layer": 2}, "cpu"))
        row = _run("sequoia", target, p, s, measured, tree_nodes=4)
        assert row.output_ids == ref
        assert len(row.notes["sequoia_acceptance"]) == 4 and row.notes["sequoia_expected_al"] >= 1.0
        assert row.notes["sequoia_acceptance_source"].startswith("measured")


def test_sequoia_with_no_tree_that_pays_decodes_as_ar_drafting_nothing(target):
    """A drafter this costly and this poor: the DP's best tree is the empty one, so no drafter runs."""
    from specstudy.engine.methods.layer_skip import early_exit_draft

    s = Sampling(temperature=0.0, max_new_tokens=16)
    p = PROMPTS[0]
    ref = get_method("ar").decode(DecodeJob(target, [p], s))[0]
    poor = SequoiaDrafter("self:2", early_exit_draft(target, {"exit_layer": 2}, "cpu"))
    row = _run(
        "sequoia",
        target,
        p,
        s,
        poor,
        tree_nodes=6,
        sequoia_acceptance="0.01",
        sequoia_cost="1:1,8:2",
        sequoia_draft_cost=0.9,
    )
    assert row.notes["sequoia_tree"] == "[]" and row.notes["sequoia_expected_al"] == 1.0
    assert row.output_ids == ref.output_ids and row.tree_nodes == 0
    assert all(st.drafted == 0 for st in row.steps)


# --------------------------------------------------------------------------------------------
# sampling: exact


def test_without_replacement_rule_is_exact_and_the_test_has_power():
    torch.manual_seed(0)
    v, trials = 5, 6000
    p = torch.softmax(torch.randn(v, dtype=torch.float64) * 2, 0)
    q = torch.softmax(torch.randn(v, dtype=torch.float64) * 2, 0)
    s = Sampling(temperature=1.0)

    def first_token(gen, renormalise: bool) -> int:
        tree = ProposalTree(tokens=[0], parents=[-1])
        for tok, qj in draws_without_replacement(q, 3, gen):
            tree.propose(0, tok, qj if renormalise else q, 0)
        v_ = accept_proposals(tree, torch.log(p).expand(len(tree), -1), s, gen)
        return tree.tokens[v_.path[1]] if v_.accepted else v_.next_token

    for renorm, exact in [(True, True), (False, False)]:
        gen = torch.Generator().manual_seed(1)
        counts = torch.bincount(torch.tensor([first_token(gen, renorm) for _ in range(trials)]), minlength=v).double()
        p_value = chi_square_p(counts, trials * p)
        assert (p_value > SIGNIFICANCE) if exact else (p_value < SIGNIFICANCE)


V, K, N = 4, 3, 500
PROMPT = [0, 3, 1]


@pytest.fixture(scope="module")
def small_vocab():
    target = tiny_model(seed=11, vocab_size=V, num_layers=2, logit_scale=15.0)
    drafter = tiny_model(seed=12, vocab_size=V, num_layers=1, logit_scale=15.0)
    drafter2 = tiny_model(seed=13, vocab_size=V, num_layers=1, logit_scale=15.0)
    return target, drafter, drafter2


def _counts(rows):
    index = torch.tensor([sum(t * V ** (K - 1 - i) for i, t in enumerate(r.output_ids)) for r in rows])
    return torch.bincount(index, minlength=V**K).double()


def test_specinfer_samples_the_target_distribution(small_vocab):
    target, d1, d2 = small_vocab
    s = Sampling(temperature=1.0, max_new_tokens=K)
    p = _exact_joint(target, s, V, K, PROMPT)
    drafters = Drafters(["d1", "d2", "ngram"], ["lm", "lm", "ngram"], [d1, d2, None])
    rows = [
        _run("specinfer", target, PROMPT, replace(s, seed=i), drafters, gamma=2, tree_branching="2,1") for i in range(N)
    ]
    assert sum(s.accepted for r in rows for s in r.steps) > 0.2 * N  # trees were really accepted
    assert sum(r.notes["drafter_tokens"]["d2"] for r in rows) > 0  # the second drafter was accepted too
    assert chi_square_p(_counts(rows), N * p) > SIGNIFICANCE


def test_sequoia_samples_the_target_distribution(small_vocab):
    target, d1, _ = small_vocab
    s = Sampling(temperature=1.0, max_new_tokens=K)
    p = _exact_joint(target, s, V, K, PROMPT)
    drafter = SequoiaDrafter("d1", d1)
    opts = dict(tree_nodes=5, sequoia_acceptance="0.4,0.3,0.2", sequoia_cost="1:1,8:1", sequoia_draft_cost=0)
    rows = [_run("sequoia", target, PROMPT, replace(s, seed=i), drafter, gamma=2, **opts) for i in range(N)]
    assert rows[0].notes["sequoia_tree"].count("[") - 1 == 5
    assert sum(s.accepted for r in rows for s in r.steps) > 0.2 * N
    assert chi_square_p(_counts(rows), N * p) > SIGNIFICANCE


# --------------------------------------------------------------------------------------------
# the DP


def _all_trees(n: int):
    """Every rooted ordered tree of n nodes, as nested children tuples."""
    if n == 1:
        yield ()
        return
    for first in range(1, n):
        for head in _all_trees(first):
            for rest in _all_trees(n - first):
                yield (head,) + rest


def _topo(nested) -> Topology:
    from specstudy.engine.sequoia_dp import _from_nested

    return _from_nested(nested)


def test_dp_value_is_the_trees_expected_tokens_and_matches_brute_force():
    acc = [0.45, 0.2, 0.1, 0.05]
    best = best_trees(acc, 6, 6)
    for n, d in itertools.product(range(1, 7), range(0, 6)):
        value, topo = best[(n, d)]
        assert topo.size <= n and topo.depth <= d
        assert expected_tokens(topo, acc) == pytest.approx(value)
        brute = max(
            expected_tokens(t, acc)
            for m in range(1, n + 1)
            for t in map(_topo, _all_trees(m))
            if t.depth <= d and all(len(t.children(i)) <= len(acc) for i in range(t.size))
        )
        assert value == pytest.approx(brute)


def test_the_tree_changes_with_the_cost_curve():
    acc = [0.6, 0.15, 0.05, 0.03]
    flat = {1: 1.0, 2: 1.0, 4: 1.01, 8: 1.02, 16: 1.05, 32: 1.1}  # memory-bound GPU
    steep = {1: 1.0, 2: 1.5, 4: 2.4, 8: 4.3, 16: 8.0, 32: 15.5}  # compute-bound CPU
    wide = choose_tree(acc, flat, 32, 8, draft_cost=0.05)
    narrow = choose_tree(acc, steep, 32, 8, draft_cost=0.05)
    assert wide.topology != narrow.topology
    assert wide.nodes > narrow.nodes
    assert wide.expected_tokens > narrow.expected_tokens


def test_a_fixed_budget_fills_it_where_the_speedup_choice_drafts_nothing(target):
    """``sequoia_choose: tokens``: the DP's tree at the full node budget even where the cost curve
    says no tree pays (the default study's CPU case), with its predicted speedup below 1 beside it."""
    from specstudy.engine.methods.layer_skip import early_exit_draft
    from specstudy.engine.sequoia_dp import budget_tree

    acc, steep = [0.06, 0.02], {1: 1.0, 8: 1.4}
    chosen = choose_tree(acc, steep, 7, 3, draft_cost=0.56)
    filled = budget_tree(acc, steep, 7, 3, draft_cost=0.56)
    assert chosen.nodes == 1 and filled.nodes == 7 and filled.depth <= 3
    assert filled.expected_tokens == pytest.approx(best_trees(acc, 7, 3)[(7, 3)][0]) and filled.predicted_speedup < 1
    s = Sampling(temperature=0.0, max_new_tokens=16)
    p = PROMPTS[0]
    ref = get_method("ar").decode(DecodeJob(target, [p], s))[0].output_ids
    drafter = SequoiaDrafter("self:2", early_exit_draft(target, {"exit_layer": 2}, "cpu"))
    opts = dict(tree_nodes=6, sequoia_acceptance="0.06,0.02", sequoia_cost="1:1,8:1.4", sequoia_draft_cost=0.56)
    row = _run("sequoia", target, p, s, drafter, sequoia_choose="tokens", **opts)
    assert row.output_ids == ref and row.notes["sequoia_nodes"] == 6 and row.notes["sequoia_choose"] == "tokens"
    assert any(st.drafted for st in row.steps)
    row = _run("sequoia", target, p, s, drafter, **opts)  # the hardware-aware choice on the same inputs
    assert row.notes["sequoia_nodes"] == 0 and row.output_ids == ref


def test_options_are_checked_before_any_model_loads(target):
    with pytest.raises(ValueError, match="sequoia_choose.*'speedup', 'tokens'"):
        get_method("sequoia").check(3, 1, "self", {"sequoia_choose": "fast"})
    with pytest.raises(ValueError, match="sequoia_acceptance"):
        get_method("sequoia").check(3, 1, "self", {"sequoia_acceptance": "0.9,0.5"})
    with pytest.raises(ValueError, match="sequoia_cost"):
        get_method("sequoia").check(3, 1, "self", {"sequoia_cost": "2:1.1"})
    with pytest.raises(ValueError, match="twice"):
        merged_parts("self:2+self:2")
    with pytest.raises(ValueError, match="self:0"):
        get_method("specinfer").check(3, 1, "self:0+ngram", {})
    with pytest.raises(ValueError, match="depth 2, but gamma=3"):
        get_method("specinfer").check(3, 1, "self:2+ngram", {"tree_branching": "2,1"})
    with pytest.raises(ValueError, match="batch_size"):
        get_method("specinfer").check(3, 2, "self:2+ngram", {})
