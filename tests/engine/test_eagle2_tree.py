"""EAGLE-2's dynamic draft tree (issue 37) on tiny random float64 models.

* greedy: ``eagle`` and ``eagle3`` with ``tree_nodes`` return exactly the ``ar`` tokens, and the
  trees really branch and really get accepted;
* the incremental drafter (true pairs cached, tree nodes fed level by level under a tree mask,
  cut back after verification) gives every node it feeds the distribution a slow reference
  computes by running the node's path causally from scratch (a mask that shows siblings, or
  positions one off, fail it);
* sampling: the first K tokens follow the target's exactly computed joint law (chi-square,
  significance 0.001, fixed seeds); a residual that is not updated after a deterministic child
  is rejected (one step from the real rule) fails the same test at the same N;
* rerank keeps the most confident nodes and refuses a node list whose confidence grows.
"""

from dataclasses import replace

import pytest
import torch
from exact_distribution import chi_square_p
from exact_distribution import exact_joint as _exact_joint

import specstudy.engine.proposals as proposals_mod
from specstudy.data.model_files import tiny_model
from specstudy.engine.drafters import EagleDraft
from specstudy.engine.dynamic_tree import DraftNode, rerank
from specstudy.engine.eagle3_drafter import Eagle3Draft
from specstudy.engine.methods import DecodeJob, get_method
from specstudy.engine.methods import eagle as eagle_method
from specstudy.records import Sampling

torch.set_num_threads(1)
SIGNIFICANCE = 1e-3
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3], [5, 6, 7], [9, 9, 9, 9, 9, 9, 1, 2, 3, 4]]
GREEDY = Sampling(temperature=0.0, max_new_tokens=16)
TREE = {"tree_nodes": 6, "tree_topk": 3}


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, num_layers=4, logit_scale=8.0)


def _eagle(config, seed=5, noise=0.05):
    torch.manual_seed(seed)
    d = EagleDraft.for_target(config)
    with torch.no_grad():
        d.fc.weight.add_(noise * torch.randn_like(d.fc.weight))
    return d.double().eval()


def _eagle3(config, draft_vocab, seed=3):
    c = config
    arch = {k: getattr(c, k) for k in ("hidden_size", "intermediate_size", "num_attention_heads")}
    arch |= {"num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim}
    arch |= {"rope_theta": 10000.0, "rms_norm_eps": c.rms_norm_eps}
    torch.manual_seed(seed)
    d = Eagle3Draft(arch, c.vocab_size, torch.as_tensor(draft_vocab), aux_layers=(0, 1, 1))
    for prm in d.parameters():
        torch.nn.init.normal_(prm, std=0.5)
    return d.double().eval()


def _run(method, target, prompt, sampling, drafter, gamma=3, **options):
    spec = get_method(method)
    opts = spec.check(gamma, 1, drafter, options)
    return spec.decode(DecodeJob(target, [prompt], sampling, gamma=gamma, drafter=drafter, options=opts))[0]


def _ar(target, prompt, sampling=GREEDY):
    return get_method("ar").decode(DecodeJob(target, [prompt], sampling))[0].output_ids


# --------------------------------------------------------------------------------------------
# greedy: lossless


@pytest.mark.parametrize("method", ["eagle", "eagle3"])
def test_greedy_dynamic_tree_equals_ar_and_branches(target, method):
    draft = _eagle(target.config) if method == "eagle" else _eagle3(target.config, range(0, 64, 2))
    accepted, widest = 0, 0
    for p in PROMPTS:
        row = _run(method, target, p, GREEDY, draft, **TREE)
        assert row.output_ids == _ar(target, p)
        assert sum(s.accepted + 1 for s in row.steps) == len(row.output_ids)
        assert row.notes["tree"] == "eagle2_dynamic" and row.tree_nodes <= 6 * (len(row.steps) - 1)
        accepted += sum(s.accepted for s in row.steps)
        widest = max(widest, max(s.drafted for s in row.steps))
    assert accepted > 0  # some drafted nodes were really accepted
    assert widest >= 2  # and trees went deeper than one level


def test_options_are_checked_before_any_model_loads(target):
    spec = get_method("eagle")
    d = _eagle(target.config)
    with pytest.raises(ValueError, match="tree_topk needs tree_nodes"):
        spec.check(3, 1, d, {"tree_topk": 2})
    with pytest.raises(ValueError, match="one request at a time"):
        spec.check(3, 2, d, {"tree_nodes": 4})
    with pytest.raises(ValueError, match="do not combine"):
        spec.check(3, 1, d, {"tree_nodes": 4, "synthetic_acceptance": "alpha=0.5"})


# --------------------------------------------------------------------------------------------
# the incremental drafter grows the tree a slow reference grows


def _slow_expand(target, draft, context):
    """Each node's distribution from a causal pass over the true pairs then its path's pairs,
    every fed-back feature recomputed from scratch (no cache, no tree mask)."""
    model = eagle_method.EagleModel(target, draft)
    with torch.no_grad():
        f = target.model(input_ids=torch.tensor([context])).last_hidden_state[0]

    def run(tokens, feats):
        out = model(torch.tensor([tokens]), torch.stack(feats)[None], position_ids=torch.arange(len(tokens))[None])
        return out.logits[0, -1].softmax(-1), out.features[0, -1]

    def path_of(nodes, i):
        path = []
        while i > 0:
            path.append(i)
            i = nodes[i].parent
        return path[::-1]

    def expand(nodes, rows):
        qs = []
        for i in rows:
            toks, feats = list(context[1:]), [f[j] for j in range(len(context) - 1)]
            toks, feats = toks + [nodes[0].token], feats + [f[len(context) - 1]]
            q, fh = run(toks, feats)
            for n in path_of(nodes, i):
                toks, feats = toks + [nodes[n].token], feats + [fh]
                q, fh = run(toks, feats)
            qs.append(q)
        return torch.stack(qs)

    return expand


def test_the_incremental_drafter_gives_every_node_the_slow_references_distribution(target, monkeypatch):
    """Every distribution the drafter computed for a tree node (cache + tree mask + fed-back
    features) equals the slow reference's for that node's path, to float64 rounding."""
    draft = _eagle(target.config, noise=0.3)
    seen = []  # (committed, nodes, rows, distributions)
    real_grow = eagle_method.grow

    def spy(root, root_q, expand, depth, k):
        def recording(nodes, rows):
            out = expand(nodes, rows)
            seen.append((list(context), list(nodes), list(rows), out))
            return out

        return real_grow(root, root_q, recording, depth, k)

    real_feed = eagle_method.EagleTreeDrafter._feed_known
    context: list[int] = []

    def feed_spy(self, committed, root):
        context[:] = list(committed)
        return real_feed(self, committed, root)

    monkeypatch.setattr(eagle_method, "grow", spy)
    monkeypatch.setattr(eagle_method.EagleTreeDrafter, "_feed_known", feed_spy)
    _run("eagle", target, PROMPTS[0], GREEDY, draft, gamma=4, **TREE)
    assert len(seen) >= 6 and any(len(rows) > 1 for _, _, rows, _ in seen)
    for committed, nodes, rows, dists in seen:
        want = _slow_expand(target, draft, committed)(nodes, rows)
        assert torch.allclose(dists, want, atol=1e-9), f"context length {len(committed)}, rows {rows}"


# --------------------------------------------------------------------------------------------
# sampling: exact, and a bug one step away is seen

V, K, N = 4, 3, 600
PROMPT = [0, 3, 1]


@pytest.fixture(scope="module")
def small():
    t = tiny_model(seed=11, vocab_size=V, num_layers=2, logit_scale=15.0)
    return t, _eagle(t.config, seed=1, noise=0.5)


def _counts(rows):
    index = torch.tensor([sum(t * V ** (K - 1 - i) for i, t in enumerate(r.output_ids)) for r in rows])
    return torch.bincount(index, minlength=V**K).double()


def _sampled_p_value(small, gamma=2):
    target, draft = small
    s = Sampling(temperature=1.0, max_new_tokens=K)
    rows = [
        _run("eagle", target, PROMPT, replace(s, seed=i), draft, gamma=gamma, tree_nodes=3, tree_topk=2)
        for i in range(N)
    ]
    assert sum(st.accepted for r in rows for st in r.steps) > 0.2 * N  # trees were really accepted
    assert sum(st.accepted < st.drafted for r in rows for st in r.steps) > 0.2 * N  # and really rejected
    return chi_square_p(_counts(rows), N * _exact_joint(target, s, V, K, PROMPT))


def test_sampling_follows_the_target_exactly(small):
    assert _sampled_p_value(small) > SIGNIFICANCE


def _residual_not_updated(p, q, token, generator):
    ok, _ = REAL_STEP(p, q, token, generator)
    return ok, p


REAL_STEP = proposals_mod.sibling_step


def test_negative_control_a_residual_that_keeps_the_rejected_child_is_seen(small, monkeypatch):
    monkeypatch.setattr(proposals_mod, "sibling_step", _residual_not_updated)
    assert _sampled_p_value(small) < SIGNIFICANCE


# --------------------------------------------------------------------------------------------
# rerank


def test_rerank_keeps_the_most_confident_and_refuses_growing_confidence():
    nodes = [DraftNode(0, -1, 0, 0.0), DraftNode(1, 0, 1, -0.1), DraftNode(2, 0, 1, -2.0), DraftNode(3, 1, 2, -0.5)]
    assert rerank(nodes, 2) == [1, 3]
    assert rerank(nodes, 3) == [1, 3, 2]
    bad = nodes[:3] + [DraftNode(3, 2, 2, -0.05)]  # a child more confident than its parent
    with pytest.raises(AssertionError, match="without its parent"):
        rerank(bad, 2)
