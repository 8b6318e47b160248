"""Every method on tiny random models: lossless under greedy, batch = single, per-step counts."""

import pytest
import torch

from specstudy import metrics
from specstudy.data.model_files import tiny_model
from specstudy.engine.methods import DecodeJob, get_method, method_names
from specstudy.engine.methods.ngram import lookup
from specstudy.records import Cell, Request, Sampling

torch.set_num_threads(1)

PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3], [5, 6, 7], [9, 9, 9, 9, 9, 9, 1, 2, 3, 4]]
GREEDY = Sampling(temperature=0.0, max_new_tokens=24)


@pytest.fixture(scope="module")
def target():
    return tiny_model(seed=0, num_layers=4, logit_scale=8.0)


@pytest.fixture(scope="module")
def drafter():
    return tiny_model(seed=1, num_layers=1, logit_scale=8.0)


@pytest.fixture(scope="module")
def ar_tokens(target):
    rows = get_method("ar").decode(DecodeJob(target, PROMPTS, GREEDY))
    return [r.output_ids for r in rows]


def configs(target, drafter):
    return [
        ("draft_target", dict(drafter=drafter, gamma=4)),
        ("draft_target", dict(drafter=target, gamma=3)),  # the target drafting itself: all accepted
        ("draft_target", dict(drafter=drafter, gamma=2, options={"dynamic_gamma": "heuristic", "gamma_max": 6})),
        ("draft_target", dict(drafter=drafter, gamma=5, options={"dynamic_gamma": "confidence"})),
        ("ngram", dict(gamma=4, options={"ngram_min": 1, "ngram_max": 3})),
        ("layer_skip", dict(gamma=3, options={"exit_layer": 2})),
        ("ngram", dict(gamma=4, options={"ngram_max": 2, "dynamic_gamma": "cost"})),
        ("draft_target", dict(drafter=drafter, gamma=3, options={"dynamic_gamma": "cost", "gamma_max": 5})),
        ("draft_target", dict(drafter=drafter, gamma=4, options={"draft_in_prefill": "on"})),
        ("ngram", dict(gamma=3, options={"draft_in_prefill": "on"})),
        ("layer_skip", dict(gamma=2, options={"exit_layer": 3, "draft_in_prefill": "on"})),
        (
            "draft_target",
            dict(drafter=drafter, gamma=2, options={"draft_in_prefill": "on", "dynamic_gamma": "confidence"}),
        ),
    ]


N_CONFIGS = 12


def test_registry_lists_the_core_methods():
    assert {"ar", "draft_target", "ngram", "layer_skip"} <= set(method_names())
    with pytest.raises(ValueError, match="allowed"):
        get_method("medusa-typo")


def test_ar_batch_equals_single(target, ar_tokens):
    single = [get_method("ar").decode(DecodeJob(target, [p], GREEDY))[0].output_ids for p in PROMPTS]
    assert single == ar_tokens
    assert all(len(t) == GREEDY.max_new_tokens for t in ar_tokens)


@pytest.mark.parametrize("index", range(N_CONFIGS))
def test_greedy_is_lossless_batched_and_single(target, drafter, ar_tokens, index):
    name, kw = configs(target, drafter)[index]
    spec = get_method(name)
    rows = spec.decode(DecodeJob(target, PROMPTS, GREEDY, **kw))
    assert [r.output_ids for r in rows] == ar_tokens
    for p, want in zip(PROMPTS, ar_tokens):
        assert spec.decode(DecodeJob(target, [p], GREEDY, **kw))[0].output_ids == want


def test_self_drafting_accepts_everything(target):
    rows = get_method("draft_target").decode(DecodeJob(target, PROMPTS[:1], GREEDY, drafter=target, gamma=3))
    steps = rows[0].steps
    assert all(s.accepted == s.drafted for s in steps)
    assert len(steps) == 1 + -(-(GREEDY.max_new_tokens - 1) // 4)  # prefill + ceil(23 / (γ+1))
    assert steps[0].drafted == 0 and steps[0].emitted == 1


def test_drafts_verified_in_the_prefill_save_a_target_pass(target):
    """draft_in_prefill: the prompt pass verifies γ drafts, so the self-drafting run needs
    ceil(24 / (γ+1)) target forwards instead of 1 + ceil(23 / (γ+1))."""
    job = DecodeJob(target, PROMPTS, GREEDY, drafter=target, gamma=3, options={"draft_in_prefill": "on"})
    rows = get_method("draft_target").decode(job)
    for r in rows:
        assert r.steps[0].drafted == 3 and r.steps[0].accepted == 3 and r.steps[0].emitted == 4
        assert len(r.steps) == -(-GREEDY.max_new_tokens // 4)
    # the first chunk arrives with the first step: TTFT covers 4 tokens
    assert rows[0].chunk_tokens[0] == 4


def test_draft_in_prefill_takes_the_plain_prefill_for_a_one_token_prompt(target, drafter):
    job = DecodeJob(target, [[7], PROMPTS[0]], GREEDY, drafter=drafter, gamma=3, options={"draft_in_prefill": "on"})
    rows = get_method("draft_target").decode(job)
    plain = get_method("ar").decode(DecodeJob(target, [[7], PROMPTS[0]], GREEDY))
    assert [r.output_ids for r in rows] == [r.output_ids for r in plain]
    assert rows[0].steps[0].drafted == 0


def test_draft_in_prefill_value_is_checked():
    with pytest.raises(ValueError, match="draft_in_prefill"):
        get_method("ngram").check(3, 1, None, {"draft_in_prefill": "yes"})


@pytest.mark.parametrize("index", range(N_CONFIGS))
def test_step_counts_sum_to_emitted_and_tau_matches(target, drafter, index):
    name, kw = configs(target, drafter)[index]
    rows = get_method(name).decode(DecodeJob(target, PROMPTS, GREEDY, **kw))
    cell = Cell(
        study="t", hardware="cpu", framework="reference", method=name, task="adhoc", model="tiny", gamma=kw.get("gamma")
    )
    records = []
    for i, r in enumerate(rows):
        assert sum(s.emitted for s in r.steps) == len(r.output_ids)
        assert sum(s.accepted for s in r.steps) + len(r.steps) >= len(r.output_ids)  # each step: accepted + 1
        assert sum(s.accepted + 1 for s in r.steps) == len(r.output_ids)  # ignore_eos: nothing truncated
        assert sum(r.chunk_tokens) == len(r.output_ids) and len(r.chunk_times_s) == len(r.chunk_tokens)
        assert r.chunk_times_s == sorted(r.chunk_times_s)
        assert len(r.target_logprobs) == len(r.output_ids) == len(r.token_entropy)
        assert all(lp <= 0 for lp in r.target_logprobs) and all(h >= 0 for h in r.token_entropy)
        rec = cell.new_record(Request(f"p{i}", ""), GREEDY, steps=r.steps, output_tokens=len(r.output_ids))
        records.append(rec.fill_acceptance_from_steps())
    summary = metrics.acceptance_summary(records)
    total = sum(len(r.output_ids) for r in rows)
    assert summary["tokens_per_forward"] == pytest.approx(total / sum(len(r.steps) for r in rows))
    draft_steps = sum(1 for r in rows for s in r.steps if s.drafted > 0)
    accepted = sum(s.accepted for r in rows for s in r.steps)
    assert summary["acceptance_length"] == pytest.approx(1 + accepted / draft_steps) if draft_steps else True
    drafted = sum(s.drafted for r in rows for s in r.steps)
    assert summary["alpha"] == pytest.approx(sum(s.accepted for r in rows for s in r.steps) / drafted)


def test_greedy_logprobs_are_the_target_argmax_scores(target, ar_tokens):
    rows = get_method("ngram").decode(DecodeJob(target, PROMPTS[:1], GREEDY, gamma=3))
    ids = PROMPTS[0] + rows[0].output_ids
    with torch.no_grad():
        lp = torch.log_softmax(target(torch.tensor([ids])).logits[0], -1)
    n = len(PROMPTS[0])
    want = [lp[n - 1 + i, t].item() for i, t in enumerate(rows[0].output_ids)]
    assert rows[0].target_logprobs == pytest.approx(want, abs=1e-9)


def test_eos_stops_a_row_and_others_continue(target, ar_tokens):
    eos = ar_tokens[1][5]
    s = Sampling(temperature=0.0, max_new_tokens=24, ignore_eos=False)
    rows = get_method("draft_target").decode(
        DecodeJob(target, PROMPTS, s, drafter=target, gamma=3, eos_token_ids=[eos])
    )
    for r, want in zip(rows, ar_tokens):
        cut = want.index(eos) + 1 if eos in want else len(want)
        assert r.output_ids == want[:cut]
    assert rows[1].stop_reason == "eos"


def test_sampled_runs_are_reproducible_and_batched(target, drafter):
    s = Sampling(temperature=0.8, top_k=20, top_p=0.9, seed=7, max_new_tokens=12)
    a = get_method("draft_target").decode(DecodeJob(target, PROMPTS, s, drafter=drafter, gamma=3))
    b = get_method("draft_target").decode(DecodeJob(target, PROMPTS, s, drafter=drafter, gamma=3))
    assert [r.output_ids for r in a] == [r.output_ids for r in b]
    assert all(len(r.output_ids) == 12 for r in a)


def test_ngram_lookup_rule():
    ctx = [1, 2, 3, 9, 1, 2, 3, 7, 1, 2, 3]
    assert lookup(ctx, 2, 1, 3) == [9, 1]  # leftmost match of the 3-gram [1, 2, 3]
    assert lookup([5, 6, 7], 4, 1, 3) == []
    assert lookup([4, 1, 4], 3, 1, 2) == [1, 4]  # falls back to the 1-gram [4]
    assert lookup([4, 1, 4], 3, 2, 2) == []  # ngram_min excludes it


def test_method_spec_checks_inputs_before_decoding():
    with pytest.raises(ValueError, match="needs a drafter"):
        get_method("draft_target").check(4, 1, None, {})
    with pytest.raises(ValueError, match="gamma"):
        get_method("ngram").check(0, 1, None, {})
    with pytest.raises(ValueError, match="option 'ngram_size' is not known"):
        get_method("ngram").check(4, 1, None, {"ngram_size": 3})
    with pytest.raises(ValueError, match="ngram_min=4 > ngram_max=2"):
        get_method("ngram").check(4, 1, None, {"ngram_min": 4, "ngram_max": 2})
    with pytest.raises(ValueError, match="dynamic_gamma"):
        get_method("draft_target").check(4, 1, "d", {"dynamic_gamma": "sometimes"})
    with pytest.raises(ValueError, match="takes no drafter"):
        get_method("ar").check(None, 1, "d", {})
    assert get_method("layer_skip").check(3, 2, None, {"exit_layer": "2"}) == {"exit_layer": 2}


def test_layer_skip_exit_layer_is_checked(target):
    with pytest.raises(ValueError, match="exit layer"):
        get_method("layer_skip").decode(DecodeJob(target, PROMPTS, GREEDY, gamma=2, options={"exit_layer": 4}))


def test_draft_vocab_mismatch_is_refused(target):
    other = tiny_model(seed=2, vocab_size=50)
    with pytest.raises(ValueError, match="vocab_size"):
        get_method("draft_target").decode(DecodeJob(target, PROMPTS, GREEDY, drafter=other, gamma=2))


def test_empty_prompt_is_refused(target):
    with pytest.raises(ValueError, match="empty"):
        get_method("ar").decode(DecodeJob(target, [[]], GREEDY))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_methods_run_on_cuda_and_match_cpu(target, drafter, ar_tokens):
    dev = "cuda"
    t, d = (
        tiny_model(seed=0, num_layers=4, logit_scale=8.0).to(dev),
        tiny_model(seed=1, num_layers=1, logit_scale=8.0).to(dev),
    )
    for name, kw in [
        ("ar", {}),
        ("draft_target", dict(drafter=d, gamma=4)),
        ("ngram", dict(gamma=3)),
        ("layer_skip", dict(gamma=2, options={"exit_layer": 2})),
    ]:
        rows = get_method(name).decode(DecodeJob(t, PROMPTS, GREEDY, device=dev, **kw))
        assert [r.output_ids for r in rows] == ar_tokens, name
    s = Sampling(temperature=1.0, seed=3, max_new_tokens=8)
    rows = get_method("draft_target").decode(DecodeJob(t, PROMPTS, s, drafter=d, gamma=3, device=dev))
    assert all(len(r.output_ids) == 8 for r in rows)


def test_layer_skip_reads_a_trained_adapter_file(target, ar_tokens, tmp_path):
    from specstudy.engine.drafters import LayerSkipAdapter, save_drafter

    adapter = LayerSkipAdapter(target.config.hidden_size, exit_layer=2)
    torch.nn.init.normal_(adapter.blocks[0].linear.weight, std=0.5)  # not the identity
    path = save_drafter(adapter.double(), tmp_path / "a", target="tiny")
    spec = get_method("layer_skip")
    options = spec.check(3, 1, None, {"adapter": str(path)})
    assert options["adapter"].exit_layer == 2
    rows = spec.decode(DecodeJob(target, PROMPTS, GREEDY, gamma=3, options=options))  # exit layer from the file
    assert [r.output_ids for r in rows] == ar_tokens
    with pytest.raises(ValueError, match="trained at exit layer 2"):
        spec.decode(DecodeJob(target, PROMPTS, GREEDY, gamma=3, options={**options, "exit_layer": 3}))
    with pytest.raises(ValueError, match="kind"):
        heads = tmp_path / "h.safetensors"
        from specstudy.engine.drafters import MedusaHeads

        save_drafter(MedusaHeads(target.config.hidden_size, 2), heads, target="tiny")
        spec.check(3, 1, None, {"adapter": str(heads)})
