"""The lean batch-1 forward (:mod:`specstudy.engine.lean`) computes transformers' forward."""

from __future__ import annotations

import pytest
import torch

from specstudy.data.model_files import tiny_model
from specstudy.engine import lean
from specstudy.engine.kv import KVState
from specstudy.engine.lean import StaticKV, lean_supported, set_lean_forward


@pytest.fixture
def lean_on():
    previous = set_lean_forward(True)
    yield
    set_lean_forward(previous)


def _steps(state: KVState, prompt: list[int], blocks: list[tuple[list[int], int]]) -> list[torch.Tensor]:
    """Prefill, then each block's logits followed by a rollback of its last ``n`` tokens."""
    out = [state.forward(torch.tensor([prompt]), logits_to_keep=1)]
    for block, n in blocks:
        out.append(state.forward(torch.tensor([block])))
        state.rollback(n)
    return out


def test_lean_logits_equal_transformers_through_appends_rollbacks_and_cache_growth(lean_on, monkeypatch):
    monkeypatch.setattr(lean, "INITIAL_CAPACITY", 16)  # the blocks below grow the cache twice
    model = tiny_model(seed=3)
    prompt = list(range(5, 19))
    blocks = [([3, 4, 5, 6, 7], 3), ([8], 0), ([9, 10], 1), ([11, 12, 13, 14, 15, 16], 0), ([17] * 9, 4)]
    fast = KVState(model, 1)
    assert isinstance(fast.cache, StaticKV)
    set_lean_forward(False)
    slow = KVState(model, 1)
    assert not isinstance(slow.cache, StaticKV)
    for a, b in zip(_steps(fast, prompt, blocks), _steps(slow, prompt, blocks), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert fast.cache.capacity >= fast.cache.get_seq_length() == slow.cache.get_seq_length()
    assert fast.lengths.tolist() == slow.lengths.tolist()


def test_fused_projections_are_views_with_the_same_values(lean_on):
    model = tiny_model(seed=1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    KVState(model, 1)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    at = model.model.layers[0].self_attn
    assert at.k_proj.weight.data_ptr() == at.q_proj.weight.data_ptr() + at.q_proj.weight.numel() * 8


def test_one_fusion_per_model_until_its_weights_change(lean_on):
    model = tiny_model(seed=7, dtype="float32")
    KVState(model, 1)
    first = lean._LEAN[model]
    KVState(model, 1)
    assert lean._LEAN[model] is first  # a new request reuses the fused (and packed) weights
    with torch.no_grad():
        model.model.layers[1].self_attn.o_proj.weight.mul_(1.5)  # an in-place edit: stale copies
    KVState(model, 1)
    assert lean._LEAN[model] is not first


def test_the_final_norm_hook_still_fires(lean_on):
    model = tiny_model(seed=2)
    seen = []
    handle = model.model.norm.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    try:
        KVState(model, 1).forward(torch.tensor([[1, 2, 3]]))
    finally:
        handle.remove()
    assert seen == [torch.Size([1, 3, model.config.hidden_size])]


def test_transformers_forward_where_the_lean_one_does_not_apply(lean_on):
    model = tiny_model(seed=0)
    assert not isinstance(KVState(model, 2).cache, StaticKV)  # batch > 1: holes and masks
    model.config.hidden_act = "gelu"
    assert "hidden_act silu" in (lean_supported(model) or "")
    assert not isinstance(KVState(model, 1).cache, StaticKV)
    model.config.hidden_act = "silu"
    set_lean_forward(False)
    assert not isinstance(KVState(model, 1).cache, StaticKV)


def test_lean_state_refuses_holes(lean_on):
    state = KVState(tiny_model(seed=0), 1)
    with pytest.raises(ValueError, match="holes"):
        state.forward(torch.tensor([[1, 2]]), torch.tensor([[True, False]]))


def test_a_model_moved_after_fusing_gets_fresh_buffers(lean_on):
    model = tiny_model(seed=4)
    prompt = torch.tensor([[1, 2, 3, 4]])
    KVState(model, 1).forward(prompt)
    model.to(torch.float32)  # replaces every parameter: the old fused buffers hold stale copies
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(2.0)
    fast = KVState(model, 1).forward(prompt)
    set_lean_forward(False)
    torch.testing.assert_close(fast, KVState(model, 1).forward(prompt), rtol=0, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 4, 5, 8, 9, 17])
def test_packed_matmul_multiplies_like_f_linear_at_every_row_count(rows):
    w = torch.randn(96, 48)
    x = torch.randn(1, rows, 48)
    mm = lean.Matmul(w, pack=True)
    torch.testing.assert_close(mm(x), torch.nn.functional.linear(x, w), rtol=1e-5, atol=1e-5)
    assert not lean.Matmul(w.double(), pack=True).packs  # packing is float32 only


def test_prepare_packs_the_target_and_its_packs_count_in_its_memory(lean_on):
    model = tiny_model(seed=6, dtype="float32")
    prompt = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    assert lean.pack_bytes(model) == 0
    KVState(model, 1).forward(prompt)
    assert (
        lean.pack_bytes(model) == 0
    )  # the lean forward alone packs nothing (a draft model's memory stays its weights)
    if not lean.prepare(model):
        pytest.skip("no MKL here: nothing is packed")
    assert lean.pack_bytes(model) >= 2 * sum(p.numel() * 4 for p in model.model.layers.parameters())
    fast = KVState(model, 1)
    outs = [fast.forward(prompt), fast.forward(torch.tensor([[7, 7, 7, 7, 7]]))]
    set_lean_forward(False)
    slow = KVState(model, 1)
    for a, b in zip(outs, [slow.forward(prompt), slow.forward(torch.tensor([[7, 7, 7, 7, 7]]))], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_an_early_exit_draft_runs_the_targets_first_layers_lean(lean_on):
    from specstudy.engine.methods.layer_skip import LayerSkipDraft

    model = tiny_model(seed=5, num_layers=4)
    draft = LayerSkipDraft(model, 2)
    prompt, blocks = list(range(3, 12)), [([4, 5, 6], 2), ([7], 0), ([8, 9], 0)]
    fast = KVState(draft, 1)
    assert isinstance(fast.cache, StaticKV) and fast.cache.k.shape[0] == 2
    set_lean_forward(False)
    slow = KVState(draft, 1)
    for a, b in zip(_steps(fast, prompt, blocks), _steps(slow, prompt, blocks), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    set_lean_forward(True)
    draft.adapter = torch.nn.Identity()
    assert not isinstance(KVState(draft, 1).cache, StaticKV)  # the lean forward has no adapter


def test_a_hook_on_a_decoder_layer_keeps_transformers_forward():
    """EAGLE-3 reads features from hooks on the target's layers: the lean forward would skip them."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from specstudy.engine.lean import lean_cache

    cfg = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(cfg).eval()
    assert lean_cache(model, 1, torch.device("cpu")) is not None
    h = model.model.layers[1].register_forward_pre_hook(lambda m, a: None)
    assert lean_cache(model, 1, torch.device("cpu")) is None
    h.remove()
    assert lean_cache(model, 1, torch.device("cpu")) is not None


def test_eagle3_feature_capture_runs_lean_and_reads_transformers_streams(lean_on):
    """The cause of EAGLE-3's verification at ~2x T1 (issue 47): its capture hooked the target's layers, so
    every batch-1 verification ran transformers' forward (DynamicCache, unpacked matmuls) instead of the
    lean one.  Its hooks are now lean-aware: the lean forward runs and hands them the same streams."""
    from specstudy.engine.lean import lean_cache
    from specstudy.engine.methods.heads import AuxCapture

    model = tiny_model(seed=1, num_layers=8)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with AuxCapture(model, (2, 4, 5)) as capture:
        assert isinstance(lean_cache(model, 1, torch.device("cpu")), StaticKV)
        state = KVState(model, 1)
        state.forward(ids[:, :5], logits_to_keep=1)
        state.forward(ids[:, 5:])  # a 3-token verification block
        lean_block = capture.last
        assert lean_block is not None and lean_block.shape == (1, 3, 3 * 32)
        set_lean_forward(False)
        hf = KVState(model, 1)
        assert not isinstance(hf.cache, StaticKV)
        hf.forward(ids[:, :5], logits_to_keep=1)
        hf.forward(ids[:, 5:])
        assert capture.last is not None and torch.allclose(lean_block, capture.last, atol=1e-12)
    assert lean_cache(model, 1, torch.device("cpu")) is None  # switched off above
    set_lean_forward(True)
    h = model.model.layers[2].register_forward_pre_hook(lambda m, a: None)  # an unmarked hook still keeps transformers'
    assert lean_cache(model, 1, torch.device("cpu")) is None
    h.remove()


def test_a_token_tree_through_the_lean_forward_is_transformers_tree_forward():
    """Issue 37: tree methods verify through the lean cache.  Every node's hidden state and logits
    equal transformers' tree forward (same positions, same tree mask), and after keeping a path the
    next token's logits agree too (the path's keys moved to where a causal decode puts them)."""
    from specstudy.data.model_files import tiny_model
    from specstudy.engine.kv import new_cache
    from specstudy.engine.lean import lean_cache
    from specstudy.engine.tokentree import TokenTree, causal_forward, keep_cache_positions, tree_forward

    model = tiny_model(seed=3, num_layers=3)
    prompt = [5, 9, 2, 7, 7, 1]
    tree = TokenTree(tokens=[4, 8, 3, 6, 2, 9], parents=[-1, 0, 0, 1, 1, 2])
    path = [0, 1, 4]
    lean = lean_cache(model, 1, torch.device("cpu"))
    assert lean is not None
    out = {}
    for name, cache in (("lean", lean), ("transformers", new_cache(model))):
        causal_forward(model, cache, 0, prompt)
        h, logits = tree_forward(model, cache, len(prompt), tree)
        keep_cache_positions(cache, len(prompt), path)
        _, nxt = causal_forward(model, cache, len(prompt) + len(path), [11])
        out[name] = (h, logits, nxt)
    for a, b in zip(out["lean"], out["transformers"]):
        assert torch.allclose(a, b, atol=1e-10)
