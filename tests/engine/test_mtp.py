"""The MTP layer (engine/mtp_drafter.py), its training, the ``mtp`` method and the MiMo export vLLM loads.

The export is checked before anything else: the MiMo folder's base model, read by transformers'
Qwen2 (what vLLM's ``MiMoForCausalLM`` is), gives the target's greedy ids and logits; then mistakes
planted in it (two layers swapped, the MTP input's halves swapped, its two input norms swapped, its
final norm left out) each fail :func:`check_mimo`, naming what differs.
"""

from __future__ import annotations

import json

import pytest
import torch

from specstudy.backends.vllm import mimo_export
from specstudy.backends.vllm.mimo_export import check_mimo, mimo_config, write_mimo
from specstudy.data.model_files import tiny_model
from specstudy.engine.methods import DecodeJob, get_method
from specstudy.engine.mtp_drafter import MtpDraft, load_mtp, save_mtp
from specstudy.records import Sampling
from specstudy.train.data import generate_with_features
from specstudy.train.distill import train_drafter
from specstudy.train.loop import TrainSettings

torch.set_num_threads(1)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [5, 6, 7], [9, 9, 9, 1, 2, 3, 4], [11, 3, 11, 3, 40, 41]]
GREEDY = Sampling(temperature=0.0, max_new_tokens=24)


@pytest.fixture(scope="module")
def target():
    """Tied embeddings, as SmolLM2: the export must still write ``lm_head``."""
    return tiny_model(seed=0, num_layers=4, logit_scale=1.0, tie_word_embeddings=True, rope_theta=50000.0)


@pytest.fixture(scope="module")
def layer(target):
    """An MTP layer trained on the target's own continuations (its halves and norms no longer symmetric)."""
    starts = [list(range(1 + i, 7 + i)) for i in range(0, 60, 3)] + PROMPTS
    corpus, feats = generate_with_features(target, starts, 24, "mtp", label_top_k=8, batch_size=8)
    settings = TrainSettings(kind="mtp", steps=120, batch_tokens=128, lr=3e-3, unroll=2)
    module = train_drafter(target, feats, settings, prompt_lengths=[p for _, p in corpus]).module
    assert isinstance(module, MtpDraft)
    return module.double().eval()


@pytest.fixture(scope="module")
def target_dir(target, tmp_path_factory):
    d = tmp_path_factory.mktemp("target")
    target.float().save_pretrained(d)
    target.double()
    return d


def _decode(target, draft, prompts=PROMPTS, gamma=3):
    return get_method("mtp").decode(DecodeJob(target, prompts, GREEDY, gamma=gamma, drafter=draft))


def test_training_data_holds_the_hidden_state_before_the_final_norm(target):
    _, feats = generate_with_features(target, [[1, 2, 3]], 4, "mtp", label_top_k=4, batch_size=1)
    norm = target.model.norm
    assert torch.allclose(norm(feats.hidden), feats.final) and not torch.allclose(feats.hidden, feats.final)


def test_the_trained_layer_is_lossless_and_accepts(target, layer):
    ar = get_method("ar").decode(DecodeJob(target, PROMPTS, GREEDY))
    rows = _decode(target, layer)
    assert [r.output_ids for r in rows] == [r.output_ids for r in ar]
    accepted, drafted = (sum(getattr(s, f) for r in rows for s in r.steps) for f in ("accepted", "drafted"))
    untrained = _decode(target, MtpDraft.for_target(target.config).double())
    assert accepted > 2 * sum(s.accepted for r in untrained for s in r.steps) and accepted >= 0.2 * drafted


def test_batched_rows_decode_as_single_ones(target, layer):
    one = [_decode(target, layer, [p])[0] for p in PROMPTS]
    many = _decode(target, layer)
    assert [[(s.drafted, s.accepted) for s in r.steps] for r in many] == [
        [(s.drafted, s.accepted) for s in r.steps] for r in one
    ]


def test_the_embedding_at_position_zero_is_masked_as_vllm_does(layer):
    h = layer.hidden_size
    e, f = torch.randn(1, 3, h, dtype=torch.double), torch.randn(1, 3, h, dtype=torch.double)
    pos = torch.arange(3)[None]
    e2 = e.clone()
    e2[0, 0] += 1.0
    a, b = layer(e, f, position_ids=pos), layer(e2, f, position_ids=pos)
    assert torch.equal(a[0, 0], b[0, 0])
    e3 = e.clone()
    e3[0, 1] += 1.0
    assert not torch.allclose(layer(e3, f, position_ids=pos)[0, 1], a[0, 1])


def test_the_folder_round_trips_and_a_wrong_target_is_refused(target, layer, tmp_path):
    folder = save_mtp(layer, tmp_path / "mtp", {"target": "tiny"})
    back = load_mtp(folder, target.config).double()
    assert [r.output_ids for r in _decode(target, back)] == [r.output_ids for r in _decode(target, layer)]
    with pytest.raises(ValueError, match="hidden_size 32 is not the target's 48"):
        load_mtp(folder, tiny_model(num_layers=2, hidden_size=48).config)
    with pytest.raises(ValueError, match="no config.json"):
        get_method("mtp").check(3, 1, str(tmp_path / "nothing"), {})


def test_the_mimo_base_model_computes_the_target(target, layer, target_dir, tmp_path):
    from transformers import Qwen2ForCausalLM

    folder = write_mimo(target_dir, save_mtp(layer, tmp_path / "mtp"), tmp_path / "mimo")
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg == mimo_config(target.config) and cfg["tie_word_embeddings"] is False
    base = Qwen2ForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    assert base.model.layers[0].self_attn.q_proj.bias is not None  # a Qwen2 layer, its biases zero
    ids = torch.tensor([PROMPTS[0]])
    want = target.generate(ids, max_new_tokens=24, do_sample=False, attention_mask=torch.ones_like(ids))
    got = base.generate(ids, max_new_tokens=24, do_sample=False, attention_mask=torch.ones_like(ids))
    assert torch.equal(want, got)
    assert torch.allclose(target(want).logits, base(want).logits, atol=1e-5)
    check_mimo(folder, target, layer)


def _swap_layers(state):
    for name in [k for k in state if k.startswith("model.layers.1.")]:
        other = name.replace("model.layers.1.", "model.layers.2.")
        state[name], state[other] = state[other], state[name]


def _swap_halves(state):
    w = state["model.mtp_layers.0.input_proj.weight"]
    state["model.mtp_layers.0.input_proj.weight"] = torch.cat(w.chunk(2, dim=1)[::-1], dim=1)


def _swap_norms(state):
    a, b = "model.mtp_layers.0.token_layernorm.weight", "model.mtp_layers.0.hidden_layernorm.weight"
    state[a], state[b] = state[b], state[a]


def _skip_final_norm(state):
    del state["model.mtp_layers.0.final_layernorm.weight"]


def _bias_in_mtp_layer(state):
    state["model.mtp_layers.0.self_attn.k_proj.bias"] += 0.01


PLANTS = {
    "mtp_bias_nonzero": (_bias_in_mtp_layer, "non-zero attention biases"),
    "layer_order": (_swap_layers, "base model's greedy ids differ"),
    "concat_order": (_swap_halves, "MTP layer read back differs"),
    "norms_swapped": (_swap_norms, "MTP layer read back differs"),
    "final_norm_left_out": (_skip_final_norm, "missing \\['final_layernorm.weight'\\]"),
}


@pytest.mark.parametrize("plant", sorted(PLANTS))
def test_each_planted_export_mistake_fails_the_check(target, layer, target_dir, tmp_path, monkeypatch, plant):
    real = mimo_export.mimo_state
    slip, words = PLANTS[plant]

    def planted(*args):
        state = real(*args)
        slip(state)
        return state

    monkeypatch.setattr(mimo_export, "mimo_state", planted)
    folder = write_mimo(target_dir, save_mtp(layer, tmp_path / "mtp"), tmp_path / plant)
    with pytest.raises(ValueError, match=words):
        check_mimo(folder, target, layer)


@pytest.mark.slow
def test_smollm2_as_mimo_gives_smollm2s_greedy_ids_and_logits(tmp_path):
    """The real target: SmolLM2-135M-Instruct (tied embeddings, rope theta 1e5) as Qwen2 layers."""
    from transformers import Qwen2ForCausalLM

    from specstudy.data.model_files import load_model, resolve

    model, tok = load_model("smollm2-135m")
    layer = MtpDraft.for_target(model.config)
    folder = write_mimo(resolve("smollm2-135m"), save_mtp(layer, tmp_path / "mtp"), tmp_path / "mimo")
    base = Qwen2ForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tok("def fibonacci(n):", return_tensors="pt").input_ids
    want = model.generate(ids, max_new_tokens=32, do_sample=False, attention_mask=torch.ones_like(ids))
    got = base.generate(ids, max_new_tokens=32, do_sample=False, attention_mask=torch.ones_like(ids))
    assert torch.equal(want, got)
    with torch.no_grad():
        a, b = model(want).logits, base(want).logits
    assert float((a - b).abs().max()) <= 1e-3 * float(a.abs().max())


def test_vllm_runs_mtp_on_the_mimo_target_one_engine_per_layer(target_dir, layer, tmp_path, monkeypatch):
    from specstudy.backends.vllm import speculative_config as sc
    from specstudy.records import Cell

    monkeypatch.setattr("specstudy.data.fetch.cache_dir", lambda: tmp_path / "cache")
    folder = str(save_mtp(layer, tmp_path / "mtp"))
    assert sc.speculative_config("mtp", 4, folder, {}) == {"method": "mtp", "num_speculative_tokens": 4}
    path = sc.engine_model(str(target_dir), "mtp", folder)
    assert json.loads((tmp_path / "cache" / "mimo" / path.rsplit("/", 1)[1] / "config.json").read_text())[
        "architectures"
    ] == ["MiMoForCausalLM"]
    assert sc.engine_model(str(target_dir), "mtp", folder) == path  # written once
    assert sc.engine_model(str(target_dir), "eagle3", folder) == sc.engine_model(str(target_dir), "mtp", None)
    assert sc.engine_model(str(target_dir), "mtp", None) == str(target_dir)  # a target with its own MTP layers
    cells = [Cell("s", "cpu", "vllm", "mtp", "code", "m", drafter=d, gamma=4) for d in (folder, "other")]
    assert sc.engine_key(cells[0], None) != sc.engine_key(cells[1], None)


def test_the_mimo_folder_gives_every_qwen2_layer_zero_biases_the_mtp_layer_included(layer, target_dir, tmp_path):
    from safetensors.torch import load_file

    state = load_file(
        str(write_mimo(target_dir, save_mtp(layer, tmp_path / "mtp"), tmp_path / "mimo") / "model.safetensors")
    )
    for prefix in ("model.layers.0.", "model.layers.3.", "model.mtp_layers.0."):
        for p in ("q_proj", "k_proj", "v_proj"):
            bias = state[f"{prefix}self_attn.{p}.bias"]
            assert bias.shape[0] == state[f"{prefix}self_attn.{p}.weight"].shape[0] and not bias.any()
    assert "model.layers.4.self_attn.q_proj.bias" not in state and torch.equal(
        state["lm_head.weight"], state["model.embed_tokens.weight"]
    )
