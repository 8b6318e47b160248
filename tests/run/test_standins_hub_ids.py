"""the reference engine loads a hub id (the h200 profile's SpecInfer/Sequoia/chain rows name
``meta-llama/Llama-2-7b-chat-hf`` and ``JackFram/llama-68m``), here from an offline hub cache holding a
random-weight stand-in under that id."""

import pytest

from specstudy.config.model import get_entry
from specstudy.data import standins

# JackFram/llama-68m's published config.json (huggingface.co/JackFram/llama-68m): LlamaForCausalLM,
# 2 layers, hidden 768, 12 heads, vocab 32000, 2048 positions
LLAMA_68M = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_attention_heads": 12,
    "num_hidden_layers": 2,
    "max_position_embeddings": 2048,
    "vocab_size": 32000,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "pad_token_id": 1,
}


def test_get_entry_takes_a_hub_id_and_still_refuses_other_names():
    e = get_entry("JackFram/llama-68m")
    assert (e.source, e.repo) == ("hub", "JackFram/llama-68m")
    with pytest.raises(ValueError, match="'no-such-model' is not known.*hub id owner/name"):
        get_entry("no-such-model")
    with pytest.raises(ValueError, match="is not known"):
        get_entry("a/b/c")


def test_scaled_config_keeps_vocab_context_rope_and_the_gqa_ratio():
    llama70 = {**LLAMA_68M, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8}
    llama70["rope_scaling"] = {"rope_type": "llama3", "factor": 8.0}
    cfg, notes = standins.scaled_config(llama70, layers=6)
    assert (cfg["vocab_size"], cfg["max_position_embeddings"], cfg["rope_scaling"]) == (
        32000,
        2048,
        llama70["rope_scaling"],
    )
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]) == (8, 1, 256)
    assert "num_hidden_layers: 80 -> 6" in notes and "num_key_value_heads: 8 -> 1" in notes
    mha, _ = standins.scaled_config({**LLAMA_68M, "num_attention_heads": 52})  # Vicuna-33B: MHA stays MHA
    assert mha["num_attention_heads"] == mha["num_key_value_heads"] == 8


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg, _ = standins.scaled_config({**LLAMA_68M, "vocab_size": 320}, layers=1, head_dim=4)
    standins.place_in_hub_cache(standins.write_standin(cfg, tmp_path / "m"), "JackFram/llama-68m", cache)
    return cache


def test_reference_engine_loads_a_hub_id_offline(hub_cache):
    from specstudy.backends.reference.reference_backend import ReferenceBackend
    from specstudy.records import Cell, Request, Sampling

    be = ReferenceBackend("JackFram/llama-68m", drafter="JackFram/llama-68m")
    assert be.model.config.vocab_size == 320 and len(be.tokenizer) == 320
    sampling = Sampling(temperature=0.0, max_new_tokens=3, ignore_eos=True)
    for method, gamma in (("ar", None), ("draft_target", 2)):
        drafter = "JackFram/llama-68m" if gamma else None
        cell = Cell("s", "h200", "reference", method, "code", "JackFram/llama-68m", drafter, gamma)
        recs = list(be.run([Request(prompt_id="p0", prompt="def f(x):")], sampling, cell))
        assert len(recs) == 1 and recs[0].output_tokens == 3, method


def test_a_quantized_models_stand_in_is_not_declared_quantized():
    """TheBloke/Llama-2-13B-chat-AWQ's config declares AWQ; random float weights must not (vLLM refused
    float32 for AWQ in the rtx4090 rehearsal)."""
    cfg, notes = standins.scaled_config({**LLAMA_68M, "quantization_config": {"quant_method": "awq", "bits": 4}})
    assert "quantization_config" not in cfg and "quantization_config (awq) dropped" in notes


def test_an_eagle3_head_over_the_whole_vocabulary_ships_no_draft_map():
    """vLLM's Eagle3LlamaForCausalLM has no draft_id_to_target_id when draft and target vocabularies are
    one (EAGLE3-Vicuna1.3-13B: 32000 of 32000): a d2t in the checkpoint failed its load."""
    import torch
    from transformers import LlamaConfig

    from specstudy.engine.eagle3_drafter import Eagle3Draft

    target = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=8
    )
    full = Eagle3Draft.for_target(target, torch.arange(64)).engine_state_dict()
    part = Eagle3Draft.for_target(target, torch.arange(16)).engine_state_dict()
    assert "d2t" not in full and "t2d" not in full and "d2t" in part


def test_a_stand_in_target_gives_vllm_three_distinct_eagle3_feature_layers():
    """vLLM collects the aux hidden states of layers (2, n // 2, n - 3) once each: a 6-layer stand-in gave
    (2, 3, 3), two features for a head whose fc wants three, and vLLM's engine died on every EAGLE-3 cell."""
    from specstudy.engine.eagle3_drafter import default_aux_layers

    llama70 = {**LLAMA_68M, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8}
    cfg, _ = standins.scaled_config(llama70)
    ids = default_aux_layers(cfg["num_hidden_layers"])
    assert len(set(ids)) == 3 and max(ids) < cfg["num_hidden_layers"]
    with pytest.raises(ValueError, match="at least 7 layers"):
        default_aux_layers(6)
