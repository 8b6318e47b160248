"""Token trees and Medusa-style heads: masks, cache, losslessness, exact sampling, training.

* tree mask: each node attends to exactly its ancestors (and the cache); a tree pass gives the
  same logits as running every root-to-node path causally; keeping the accepted path leaves
  the cache a plain causal decode would have.
* greedy: ``tree`` (self-drafter, a drafter model, the target as its own drafter) and ``heads``
  (linear at batch 2, tree) return exactly the ``ar`` tokens on tiny random float64 models.
* sampling: the first K tokens of ``tree`` and of ``heads`` in tree mode follow the target's
  exactly computed distribution (chi-square goodness of fit, significance 0.001, cells with
  expected count < 5 pooled, fixed seeds: deterministic).  The multi-draft rule itself is also
  checked on synthetic distributions, with a negative control (siblings tested against p
  without the residual update) that the same test rejects; the same bug end to end through ``tree`` at
  T = 1 (N = 2000 decodes) is rejected too.
* per-step counts: drafted = tree depth, accepted = accepted path length, emitted sums to the
  output, τ = tokens / steps.
* training: a few steps on a tiny model lower the distillation loss; files round-trip.
"""

import json
import random

import pytest
import torch
from exact_distribution import chi_square_p
from exact_distribution import exact_joint as _exact_joint

from specstudy.data.model_files import tiny_model
from specstudy.engine import drafters as D
from specstudy.engine.methods import DecodeJob, get_method
from specstudy.engine.methods import tree as T
from specstudy.engine.methods.heads import draft_chain
from specstudy.metrics import acceptance_length, tokens_per_forward
from specstudy.records import RequestRecord, Sampling
from specstudy.train.data import collect_features, generate_with_features
from specstudy.train.distill import train_drafter
from specstudy.train.loop import TrainSettings

torch.set_num_threads(1)
SIGNIFICANCE = 1e-3


def random_tree(n: int, seed: int) -> T.TokenTree:
    rng = random.Random(seed)
    tree = T.TokenTree(tokens=[rng.randrange(50)], parents=[-1])
    for i in range(1, n):
        tree.add(rng.randrange(i), rng.randrange(50))
    return tree


def ancestors(tree: T.TokenTree, i: int) -> set[int]:
    out = set()
    while i >= 0:
        out.add(i)
        i = tree.parents[i]
    return out


# --------------------------------------------------------------------------------------------
# masks and cache


@pytest.mark.parametrize("seed", range(5))
def test_each_node_attends_exactly_to_its_ancestors(seed):
    tree = random_tree(12, seed)
    past = 5
    mask = T.tree_attention_mask(tree.parents, past)
    assert mask.shape == (1, 1, len(tree), past + len(tree))
    allowed = mask[0, 0] == 0
    assert allowed[:, :past].all()  # the committed prefix is visible to every node
    for i in range(len(tree)):
        seen = {j for j in range(len(tree)) if allowed[i, past + j]}
        assert seen == ancestors(tree, i)
    pos = T.tree_position_ids(tree.parents, past)[0].tolist()
    assert pos == [past + d for d in tree.depths]


def test_tree_order_is_enforced():
    with pytest.raises(ValueError, match="precede"):
        T.TokenTree(tokens=[1, 2, 3], parents=[-1, 2, 0])
    with pytest.raises(ValueError, match="root"):
        T.TokenTree(tokens=[1, 2], parents=[0, 0])
    with pytest.raises(ValueError, match="positive integers"):
        T.parse_branching("2,0")


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_tree_pass_equals_causal_paths_and_cache_keeps_the_path(attn):
    from specstudy.engine.kv import new_cache

    model = tiny_model(seed=3, num_layers=2, attn_implementation=attn)
    prompt = [5, 9, 2, 7, 1]
    tree = random_tree(9, seed=7)
    cache = new_cache(model)
    T.causal_forward(model, cache, 0, prompt)
    _, logits = T.tree_forward(model, cache, len(prompt), tree)
    # eager attention takes its softmax in float32 whatever the model's dtype: two float64 passes
    # over different key sets then agree to ~1e-8, not to float64 rounding
    atol = 1e-10 if attn == "sdpa" else 1e-6
    with torch.no_grad():
        for i in range(len(tree)):
            path = sorted(ancestors(tree, i))  # breadth-first order = root-to-node order on a path
            ref = model(torch.tensor([prompt + [tree.tokens[j] for j in path]])).logits[0, -1]
            assert torch.allclose(logits[i], ref, atol=atol)
        leaf = max(range(len(tree)), key=lambda i: tree.depths[i])
        path = sorted(ancestors(tree, leaf))
        T.keep_cache_positions(cache, len(prompt), path)
        assert cache.get_seq_length() == len(prompt) + len(path)
        _, nxt = T.causal_forward(model, cache, len(prompt) + len(path), [4])
        ref = model(torch.tensor([prompt + [tree.tokens[j] for j in path] + [4]])).logits[0, -1]
        assert torch.allclose(nxt[-1], ref, atol=atol)


# --------------------------------------------------------------------------------------------
# greedy losslessness and per-step counts


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=1, num_layers=3, logit_scale=4.0)


@pytest.fixture(scope="module", params=[False, True], ids=["medusa", "token_conditioned"])
def heads_file(tmp_path_factory, target, request):
    """Heads with random (not identity) blocks: some drafts hit, most miss."""
    torch.manual_seed(0)
    heads = D.MedusaHeads(target.config.hidden_size, num_heads=3, num_layers=2, token_conditioned=request.param)
    for p in heads.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return D.save_drafter(heads, tmp_path_factory.mktemp("heads") / "h", target="tiny")


PROMPTS = [[1, 2, 3, 4, 5], [7, 8, 9], [11, 3, 11, 3, 11, 3, 40, 41]]


def decode(method, target, prompts, sampling, gamma=3, drafter=None, **options):
    """As the reference backend does: check with the drafter's name, then load it."""
    spec = get_method(method)
    opts = spec.check(gamma, len(prompts), drafter, options)
    if isinstance(drafter, str):
        drafter = spec.load_drafter(drafter, target, "cpu", "float64")
    return spec.decode(
        DecodeJob(target=target, prompts=prompts, sampling=sampling, gamma=gamma, drafter=drafter, options=opts)
    )


def check_counts(row, depth_max):
    assert sum(s.emitted for s in row.steps) == len(row.output_ids)
    for s in row.steps[1:]:
        assert s.drafted <= depth_max and s.accepted <= s.drafted and s.emitted <= s.accepted + 1
    rec = RequestRecord(
        study="t",
        hardware="cpu",
        framework="reference",
        method="m",
        task="t",
        prompt_id="p",
        repeat=0,
        cell_id="c",
        model="tiny",
        output_tokens=len(row.output_ids),
        steps=row.steps,
    )
    rec.fill_acceptance_from_steps()
    assert tokens_per_forward(sum(s.emitted for s in rec.steps), rec.target_forwards) == len(row.output_ids) / len(
        row.steps
    )
    if rec.draft_steps:  # every draft step ends in one target token, so AL = emitted per draft step there
        drafted = [s for s in rec.steps if s.drafted > 0]
        assert acceptance_length(rec.accepted_tokens, rec.draft_steps) == pytest.approx(
            sum(s.accepted + 1 for s in drafted) / len(drafted)
        )


@pytest.mark.parametrize("case", ["self", "self_branching", "other_model", "target_as_drafter"])
def test_tree_greedy_equals_ar(target, case):
    s = Sampling(temperature=0.0, max_new_tokens=24)
    drafter = {
        "self": "self",
        "self_branching": "self:2",
        "other_model": tiny_model(seed=5, num_layers=1, logit_scale=4.0),
        "target_as_drafter": target,
    }[case]
    options = {
        "self": {"tree_width": 2},
        "self_branching": {"tree_branching": "3,2,1"},
        "other_model": {"tree_width": 3},
        "target_as_drafter": {"tree_branching": "2,2,1"},
    }[case]
    for p in PROMPTS:
        ref = decode("ar", target, [p], s)[0].output_ids
        row = decode("tree", target, [p], s, drafter=drafter, **options)[0]
        assert row.output_ids == ref
        check_counts(row, 3)
        assert row.tree_nodes >= sum(s.drafted for s in row.steps)
        if case == "target_as_drafter":  # a perfect drafter: every full-depth path is accepted
            assert all(st.accepted == st.drafted for st in row.steps)
            assert [st.drafted for st in row.steps[1:-1]] == [3] * (len(row.steps) - 2)


def test_tree_options_are_checked_before_decoding(target):
    spec = get_method("tree")
    with pytest.raises(ValueError, match="depth 2, but gamma=3"):
        spec.check(3, 1, "self", {"tree_branching": "2,1"})
    with pytest.raises(ValueError, match="batch_size=2"):
        spec.check(3, 2, "self", {})
    with pytest.raises(ValueError, match="needs a drafter"):
        spec.check(3, 1, None, {})
    with pytest.raises(ValueError, match="'self:K'"):
        spec.check(3, 1, "self:x", {})
    with pytest.raises(ValueError, match="no such file"):
        spec.check(3, 1, "missing-adapter.safetensors", {})
    with pytest.raises(ValueError, match="not known"):
        spec.check(3, 1, "self", {"tree_wdth": 2})
    with pytest.raises(ValueError, match="need 1 <= k"):
        get_method("tree").load_drafter("self:3", target, "cpu", "float64")  # k must leave a layer out


def test_a_tree_drafter_named_by_model_loads_through_the_registry(target, monkeypatch):
    """Neither self:K nor an adapter file: the drafter comes from specstudy.data.model_files (this
    branch imported a module that no longer exists)."""
    calls = []

    def fake_load_model(name, device, dtype):
        calls.append((name, device, dtype))
        return "draft-lm", "tokenizer"

    import specstudy.data.model_files as registry  # tree imports it lazily (the engine imports no config)

    monkeypatch.setattr(registry, "load_model", fake_load_model)
    assert get_method("tree").load_drafter("some-draft-model", target, "cpu", "float64") == "draft-lm"
    assert calls == [("some-draft-model", "cpu", "float64")]


def test_heads_linear_batch_and_tree_greedy_equal_ar(target, heads_file):
    s = Sampling(temperature=0.0, max_new_tokens=24)
    refs = [decode("ar", target, [p], s)[0].output_ids for p in PROMPTS]
    rows = decode("heads", target, PROMPTS, s, gamma=3, drafter=str(heads_file))
    assert [r.output_ids for r in rows] == refs
    for r in rows:
        check_counts(r, 3)
    for p, ref in zip(PROMPTS, refs):
        row = decode("heads", target, [p], s, gamma=3, drafter=str(heads_file), heads_tree="3,2,2")[0]
        assert row.output_ids == ref
        check_counts(row, 3)


def test_heads_options_are_checked(heads_file, tmp_path):
    spec = get_method("heads")
    with pytest.raises(ValueError, match="needs a drafter"):
        spec.check(3, 1, None, {})
    with pytest.raises(ValueError, match="no heads file"):
        spec.check(3, 1, str(tmp_path / "missing"), {})
    with pytest.raises(ValueError, match="needs 4 heads"):
        spec.check(4, 1, str(heads_file), {})
    with pytest.raises(ValueError, match="depth 2, but gamma=3"):
        spec.check(3, 1, str(heads_file), {"heads_tree": "2,2"})
    with pytest.raises(ValueError, match="one request at a time"):
        spec.check(3, 2, str(heads_file), {"heads_tree": "2,2,1"})


def test_heads_read_the_verification_hidden_state(target, heads_file):
    """Head drafts equal heads applied to the hidden state at the last accepted token, computed
    independently by a full forward over the emitted text."""
    heads = D.load_drafter(heads_file, kind="heads").to(torch.float64)
    s = Sampling(temperature=0.0, max_new_tokens=12)
    prompt = PROMPTS[2]
    row = decode("heads", target, [prompt], s, gamma=3, drafter=str(heads_file))[0]
    # after a step the pending token is the last emitted one (index emitted-1 of seq); the next
    # step's drafts come from the hidden state at the token before it and predict seq[emitted:]
    seq = prompt + row.output_ids
    with torch.no_grad():
        hidden = target.model(input_ids=torch.tensor([seq])).last_hidden_state[0]
    emitted = len(prompt)
    for st in row.steps[:-1]:
        emitted += st.emitted
        drafts = draft_chain(heads, target, hidden[emitted - 2][None], torch.tensor([seq[emitted - 1]]), 3, s, None)[0][
            0
        ].tolist()
        nxt = seq[emitted : emitted + 3]
        n_match = next((i for i, (a, b) in enumerate(zip(drafts, nxt)) if a != b), len(nxt))
        # the step after this one accepted exactly the drafts that match the target's text
        following = row.steps[row.steps.index(st) + 1]
        assert following.accepted == min(n_match, following.drafted)


# --------------------------------------------------------------------------------------------
# exact sampling: the multi-draft rule on synthetic distributions


def _simplex(g: torch.Generator, v: int) -> torch.Tensor:
    x = torch.rand(v, generator=g, dtype=torch.float64) ** 3
    return x / x.sum()


def _multi_draft_first_two(trials: int, v: int, step, seed: int) -> torch.Tensor:
    """Counts of the first two emitted tokens; each step grows a 2-level tree (3 then 2 children
    per node, drawn i.i.d. from per-node draft distributions) and verifies it with ``step``."""
    g = torch.Generator().manual_seed(seed)
    p1, q1 = _simplex(g, v), _simplex(g, v)
    p2 = torch.stack([_simplex(g, v) for _ in range(v)])  # target after token x
    q2 = torch.stack([_simplex(g, v) for _ in range(v)])
    p3 = torch.stack([_simplex(g, v) for _ in range(v)])  # target two levels down (leaves)
    counts = torch.zeros(v * v, dtype=torch.float64)

    def one_step(p_root, root_tok_dist_children, target_after):
        tree = T.TokenTree(tokens=[0], parents=[-1], child_q={0: root_tok_dist_children})
        for t in torch.multinomial(root_tok_dist_children, 3, replacement=True, generator=g).tolist():
            tree.add(0, t)
        for c in (1, 2, 3):
            tree.child_q[c] = q2[tree.tokens[c]]
            for t in torch.multinomial(q2[tree.tokens[c]], 2, replacement=True, generator=g).tolist():
                tree.add(c, t)
        probs = torch.stack([p_root] + [target_after(tree, i) for i in range(1, len(tree))])
        verdict = T.accept_sampling(tree, probs, step, lambda p, gen: int(torch.multinomial(p, 1, generator=gen)), g)
        return [tree.tokens[n] for n in verdict.path[1:]] + [verdict.next_token]

    def after(tree, i):
        return p2[tree.tokens[i]] if tree.depths[i] == 1 else p3[tree.tokens[i]]

    for _ in range(trials):
        out = one_step(p1, q1, after)
        if len(out) == 1:  # the next step starts at x1: its first token is the second one
            x1 = out[0]
            out = out + one_step(p2[x1], q2[x1], lambda tree, i: p3[tree.tokens[i]])[:1]
        counts[out[0] * v + out[1]] += 1
    exact = (p1[:, None] * p2).reshape(-1)
    return counts, exact


def test_multi_draft_rule_is_exact_and_the_test_has_power():
    trials, v = 4000, 4
    counts, exact = _multi_draft_first_two(trials, v, T.sibling_step, seed=1)
    assert chi_square_p(counts, trials * exact) > SIGNIFICANCE

    def no_residual(p, q, token, gen):  # a plausible bug: every sibling tested against p itself
        ok, _ = T.sibling_step(p, q, token, gen)
        return ok, p

    counts, exact = _multi_draft_first_two(trials, v, no_residual, seed=1)
    assert chi_square_p(counts, trials * exact) < SIGNIFICANCE


# --------------------------------------------------------------------------------------------
# exact sampling end to end


V, K = 4, 3
N_FAST, N_SLOW = 2000, 2000  # decodes are batch-1 here, so N costs N separate decodes (~15 s at 2000)
PROMPT = [0, 3, 1]


@pytest.fixture(scope="module")
def small_vocab():
    target = tiny_model(seed=11, vocab_size=V, num_layers=2, logit_scale=15.0)
    drafter = tiny_model(seed=12, vocab_size=V, num_layers=1, logit_scale=15.0)
    return target, drafter


def _counts(rows):
    index = torch.tensor([sum(t * V ** (K - 1 - i) for i, t in enumerate(r.output_ids)) for r in rows])
    return torch.bincount(index, minlength=V**K).double()


@pytest.mark.parametrize(
    "sampling,n",
    [
        (Sampling(temperature=1.0, max_new_tokens=K), N_FAST),
        pytest.param(Sampling(temperature=0.8, top_k=3, max_new_tokens=K), N_SLOW, marks=pytest.mark.slow),
    ],
    ids=["t1", "t0.8-topk3"],
)
def test_tree_samples_the_target_distribution(small_vocab, sampling, n):
    from dataclasses import replace

    target, drafter = small_vocab
    p = exact_joint(target, sampling)
    assert 0.5 * (p - exact_joint(drafter, sampling)).abs().sum() > 0.2  # the draft really differs
    spec = get_method("tree")
    opts = spec.check(2, 1, drafter, {"tree_branching": "2,2"})
    rows = [
        spec.decode(DecodeJob(target, [PROMPT], replace(sampling, seed=i), gamma=2, drafter=drafter, options=opts))[0]
        for i in range(n)
    ]
    assert sum(s.accepted for r in rows for s in r.steps) > 0.2 * n  # trees were really accepted
    assert chi_square_p(_counts(rows), n * p) > SIGNIFICANCE


def test_tree_negative_control_siblings_without_the_residual_update_are_detected(small_vocab, monkeypatch):
    """The bug next to the real rule, end to end at the t1 case's size: after a rejected sibling the next
    one is tested against p itself, not norm(max(p − q, 0)); the same chi-square test rejects it."""
    from dataclasses import replace

    target, drafter = small_vocab
    s = Sampling(temperature=1.0, max_new_tokens=K)

    real_step = T.sibling_step

    def no_residual(p, q, token, gen):
        ok, _ = real_step(p, q, token, gen)
        return ok, p

    monkeypatch.setattr(T, "sibling_step", no_residual)
    spec = get_method("tree")
    opts = spec.check(2, 1, drafter, {"tree_branching": "2,2"})
    rows = [
        spec.decode(DecodeJob(target, [PROMPT], replace(s, seed=i), gamma=2, drafter=drafter, options=opts))[0]
        for i in range(N_FAST)
    ]
    assert chi_square_p(_counts(rows), N_FAST * exact_joint(target, s)) < SIGNIFICANCE


@pytest.mark.slow
def test_heads_tree_samples_the_target_distribution(small_vocab, tmp_path):
    target, _ = small_vocab
    torch.manual_seed(2)
    heads = D.MedusaHeads(target.config.hidden_size, num_heads=2, token_conditioned=True)
    for prm in heads.parameters():
        torch.nn.init.normal_(prm, std=0.5)
    path = D.save_drafter(heads, tmp_path / "h", target="tiny")
    s = Sampling(temperature=1.0, max_new_tokens=K)
    spec = get_method("heads")
    opts = spec.check(2, 1, str(path), {"heads_tree": "3,2"})
    heads = spec.load_drafter(str(path), target, "cpu", "float64")
    from dataclasses import replace

    rows = [
        spec.decode(DecodeJob(target, [PROMPT], replace(s, seed=i), gamma=2, drafter=heads, options=opts))[0]
        for i in range(N_SLOW)
    ]
    assert chi_square_p(_counts(rows), N_SLOW * exact_joint(target, s)) > SIGNIFICANCE


# --------------------------------------------------------------------------------------------
# training


# EAGLE-3 trains through its own unrolled path (train/eagle3.py), tested in test_eagle3.py
@pytest.mark.parametrize(
    "kind", [k for k in D.KINDS if k not in ("eagle3", "mtp", "dflash")]
)  # folders: test_eagle3.py, test_mtp.py, test_dflash.py
def test_training_lowers_the_loss_and_files_round_trip(kind, tmp_path):
    model = tiny_model(seed=1, dtype="float32", logit_scale=4.0)
    rng = random.Random(0)
    prompts = [[rng.randrange(96) for _ in range(rng.randint(3, 8))] for _ in range(12)]
    corpus, feats = generate_with_features(model, prompts, 24, kind, exit_layer=1, label_top_k=8, batch_size=5)
    assert all(len(ids) == plen + 24 for ids, plen in corpus)
    settings = TrainSettings(
        kind=kind,
        num_heads=2,
        exit_layer=1,
        token_conditioned=True,
        steps=60,
        batch_tokens=64,
        lr=1e-2,
        label_top_k=8,
        eval_fraction=0.25,
    )
    result = train_drafter(model, feats, settings, prompt_lengths=[p for _, p in corpus])
    assert result.log[-1]["loss"] < result.log[0]["loss"]
    assert result.eval["n"] and all(n > 0 for n in result.eval["n"])
    path = D.save_drafter(result.module, tmp_path / "d", target="tiny", info={"log": result.log})
    again = D.load_drafter(path, kind=kind, target="tiny", hidden_size=model.config.hidden_size)
    for a, b in zip(result.module.state_dict().values(), again.state_dict().values()):
        assert torch.equal(a, b)
    assert json.loads(path.with_suffix(".json").read_text())["architecture"]["kind"] == kind
    with pytest.raises(ValueError, match="trained for target"):
        D.load_drafter(path, target="other")
    # the command's acceptance measurement decodes through the engine's own method
    from specstudy.commands.train_drafter_command import measure_acceptance

    acc = measure_acceptance(model, again, kind, [("code", "p0", prompts[0]), ("code", "p1", prompts[1])], 12, 2, path)
    c = acc["per_task"]["code"]
    assert c["prompts"] == 2 and 0 <= c["accepted"] <= c["drafted"] and c["draft_steps"] > 0
    assert c["acceptance_length"] == 1 + c["accepted"] / c["draft_steps"]


# theirs are such a pass (DFlash reads EAGLE-3's feature layers: test_dflash.py)
@pytest.mark.parametrize("kind", [k for k in D.KINDS if k not in ("eagle", "eagle3", "mtp", "dflash")])
def test_features_from_generation_equal_a_teacher_forced_pass(kind):
    """The features read from batched, left-padded generation steps are those of one causal pass
    over each finished sequence (the last token, never fed during generation, excepted)."""
    model = tiny_model(seed=1, dtype="float32", logit_scale=4.0, num_layers=3)
    rng = random.Random(1)
    prompts = [[rng.randrange(96) for _ in range(rng.randint(3, 8))] for _ in range(5)]
    corpus, got = generate_with_features(model, prompts, 10, kind, exit_layer=1, label_top_k=5, batch_size=3)
    ref = collect_features(model, corpus, kind, exit_layer=1, label_top_k=5)
    keep = torch.tensor([int(ref.pos[i]) != len(corpus[int(ref.seq[i])][0]) - 1 for i in range(len(ref.seq))])
    assert torch.equal(got.seq, ref.seq[keep]) and torch.equal(got.pos, ref.pos[keep])
    assert torch.allclose(got.hidden, ref.hidden[keep], atol=1e-5)
    assert torch.allclose(got.final, ref.final[keep], atol=1e-5)
    assert torch.equal(got.label_ids, ref.label_ids[keep])
    assert torch.allclose(got.label_probs, ref.label_probs[keep], atol=1e-5)


def test_train_drafter_cli_rejects_bad_input_before_loading(capsys):
    from specstudy.cli import main

    assert main(["train-drafter", "--kind", "hydra"]) == 2
    assert "--kind='hydra'" in capsys.readouterr().err
    assert main(["train-drafter", "--kind", "heads", "--tasks", "code,poetry"]) == 2
    assert "poetry" in capsys.readouterr().err
    assert main(["train-drafter", "--kind", "eagle", "--weight-decay", "-1"]) == 2
    assert "--weight-decay=-1.0" in capsys.readouterr().err


# --------------------------------------------------------------------------------------------
# through the reference backend (cell.method, cell.drafter, cell.options)


def test_heads_and_tree_run_through_the_reference_backend(target, heads_file):
    from specstudy.backends import get_backend
    from specstudy.records import Cell, Request

    backend = get_backend("reference", model=target, dtype="float64")
    requests = [Request(prompt_id=f"p{i}", prompt="", prompt_ids=tuple(p)) for i, p in enumerate(PROMPTS)]
    s = Sampling(temperature=0.0, max_new_tokens=16)
    base = Cell(study="t", hardware="cpu", framework="reference", method="ar", task="t", model="tiny")
    ref = [r.output_ids for r in backend.run(requests, s, base)]
    cells = [
        Cell(
            study="t",
            hardware="cpu",
            framework="reference",
            method="heads",
            task="t",
            model="tiny",
            drafter=str(heads_file),
            gamma=3,
            batch_size=2,
        ),
        Cell(
            study="t",
            hardware="cpu",
            framework="reference",
            method="heads",
            task="t",
            model="tiny",
            drafter=str(heads_file),
            gamma=2,
            options=(("heads_tree", "2,2"),),
        ),
        Cell(
            study="t",
            hardware="cpu",
            framework="reference",
            method="tree",
            task="t",
            model="tiny",
            drafter="self:2",
            gamma=3,
            options=(("tree_width", 2),),
        ),
    ]
    for cell in cells:
        recs = list(backend.run(requests, s, cell))
        assert [r.status for r in recs] == ["ok"] * len(PROMPTS), [r.error for r in recs]
        assert [r.output_ids for r in recs] == ref
        for r in recs:
            assert r.drafter == cell.drafter and r.target_forwards == len(r.steps)
            assert r.accepted_tokens + r.target_forwards == r.output_tokens  # every step ends in one target token


# --------------------------------------------------------------------------------------------
# the default model and its committed heads (slow: loads SmolLM2-135M)

DEFAULT_HEADS = "params/drafters/smollm2-135m-heads.safetensors"


@pytest.mark.slow
def test_heads_and_tree_are_lossless_on_the_default_model():
    from pathlib import Path

    from specstudy.data.model_files import load_model
    from specstudy.paths import REPO_ROOT

    model, tok = load_model("smollm2-135m")
    heads = str(Path(REPO_ROOT) / DEFAULT_HEADS)
    meta = json.loads(Path(heads).with_suffix(".json").read_text())
    assert meta["target"] == "smollm2-135m" and meta["command"].startswith("specstudy train-drafter")
    assert Path(heads).stat().st_size <= 20e6
    ids = [
        tok(p)["input_ids"]
        for p in (
            'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
            "Summarize: The council met on Tuesday about the new park, opening in May.",
        )
    ]
    s = Sampling(temperature=0.0, max_new_tokens=20)
    for p in ids:
        want = decode("ar", model, [p], s)[0].output_ids
        for method, drafter, opts in [
            ("heads", heads, {}),
            ("heads", heads, {"heads_tree": "3,2,1"}),
            ("tree", "self:20", {"tree_width": 2}),
        ]:
            spec = get_method(method)
            o = spec.check(3, 1, drafter, opts)
            d = spec.load_drafter(drafter, model, "cpu", "float32")
            row = spec.decode(DecodeJob(model, [p], s, gamma=3, drafter=d, options=o))[0]
            assert row.output_ids == want, (method, opts)
            check_counts(row, 3)


def exact_joint(model, sampling):
    return _exact_joint(model, sampling, V, K, PROMPT)
