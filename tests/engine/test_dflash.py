"""The DFlash block drafter (engine/dflash_drafter.py), its training, the ``dflash`` method and the folder vLLM loads.

The folder is what vLLM's ``dflash`` method reads as it is; :func:`check_export` reads it back with
its own config (target layers, block, mask token) and compares drafts with the trained drafter's.
Mistakes planted in it (target layer ids off by one, another mask token, a short block, two
tensors swapped) each fail that check or the method's own, naming what differs.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from specstudy.data.model_files import tiny_model
from specstudy.engine.dflash_drafter import DFlashDraft, check_export, check_for_target, load_dflash, save_dflash
from specstudy.engine.methods import DecodeJob, get_method
from specstudy.records import Sampling
from specstudy.train.data import generate_with_features
from specstudy.train.distill import train_drafter
from specstudy.train.loop import TrainSettings

torch.set_num_threads(1)
PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8], [5, 6, 7], [9, 9, 9, 1, 2, 3, 4], [11, 3, 11, 3, 40, 41]]
GREEDY = Sampling(temperature=0.0, max_new_tokens=24)
MASK = 0


@pytest.fixture(scope="module")
def target():
    """Eight layers (EAGLE-3's feature layers 2, 4, 5 are distinct), peaked distributions."""
    return tiny_model(seed=0, num_layers=8, logit_scale=8.0, tie_word_embeddings=False, rope_theta=50000.0)


@pytest.fixture(scope="module")
def drafter(target):
    starts = [list(range(1 + i, 7 + i)) for i in range(0, 60, 3)] + PROMPTS
    corpus, feats = generate_with_features(target.float(), starts, 24, "dflash", label_top_k=8, batch_size=8)
    settings = TrainSettings(kind="dflash", steps=150, batch_tokens=128, lr=3e-3, block_size=5, mask_token_id=MASK)
    module = train_drafter(target, feats, settings, prompt_lengths=[p for _, p in corpus]).module
    target.double()
    assert isinstance(module, DFlashDraft)
    return module.double().eval()


def _decode(target, draft, prompts=PROMPTS, gamma=4):
    return get_method("dflash").decode(DecodeJob(target, prompts, GREEDY, gamma=gamma, drafter=draft))


def _counts(rows):
    return [[(s.drafted, s.accepted) for s in r.steps] for r in rows]


def test_the_trained_drafter_is_lossless_and_accepts_more_than_an_untrained_one(target, drafter):
    ar = get_method("ar").decode(DecodeJob(target, PROMPTS, GREEDY))
    rows = _decode(target, drafter)
    assert [r.output_ids for r in rows] == [r.output_ids for r in ar]
    untrained = DFlashDraft(drafter.arch).double().eval()
    accepted = sum(a for r in _counts(rows) for _, a in r)
    assert accepted > sum(a for r in _counts(_decode(target, untrained)) for _, a in r) + 5


def test_batched_rows_decode_as_single_ones(target, drafter):
    one = [_decode(target, drafter, [p])[0] for p in PROMPTS]
    assert _counts(_decode(target, drafter)) == _counts(one)


def test_a_block_of_gamma_drafts_costs_one_drafter_forward(target, drafter):
    calls = []
    handle = drafter.register_forward_hook(lambda *a: calls.append(1))
    try:
        rows = _decode(target, drafter, [PROMPTS[0]])
    finally:
        handle.remove()
    assert len(calls) == sum(1 for s in rows[0].steps if s.drafted) and rows[0].steps[1].drafted == 4


def test_gamma_beyond_the_block_is_refused_before_decoding(tmp_path, drafter):
    folder = save_dflash(drafter, tmp_path / "d")
    with pytest.raises(ValueError, match=r"gamma=5: allowed <= 4 \(the drafter's block_size 5\)"):
        get_method("dflash").check(5, 1, str(folder), {})


def test_the_folder_holds_vllms_names_and_config_keys(tmp_path, drafter):
    folder = save_dflash(drafter, tmp_path / "d")
    names = set(load_file(str(folder / "model.safetensors")))
    layer = {f"layers.0.{k}.weight" for k in ("input_layernorm", "post_attention_layernorm")}
    layer |= {f"layers.0.self_attn.{k}.weight" for k in ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm")}
    layer |= {f"layers.0.mlp.{k}.weight" for k in ("gate_proj", "up_proj", "down_proj")}
    assert names == layer | {"fc.weight", "hidden_norm.weight", "norm.weight"}
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"] == {"mask_token_id": MASK, "target_layer_ids": [1, 3, 4]}
    assert cfg["block_size"] == 5 and cfg["num_target_layers"] == 8


def test_the_export_reads_back_as_trained(tmp_path, target, drafter):
    folder = save_dflash(drafter, tmp_path / "d")
    check_export(drafter, folder, target)
    rounded = copy.deepcopy(drafter).to(torch.bfloat16).double()  # the folder holds bf16
    assert _counts(_decode(target, load_dflash(folder, target.config).double())) == _counts(_decode(target, rounded))


def _plant(folder, edit_config=None, edit_weights=None):
    cfg = json.loads((folder / "config.json").read_text())
    if edit_config:
        edit_config(cfg)
        (folder / "config.json").write_text(json.dumps(cfg))
    if edit_weights:
        w = load_file(str(folder / "model.safetensors"))
        edit_weights(w)
        save_file(w, str(folder / "model.safetensors"))


def _aux_ids_as_vllm_counts(cfg):  # vLLM's aux-stream ids (entering layer k) written as DFlash's (output of k)
    cfg["dflash_config"]["target_layer_ids"] = [i + 1 for i in cfg["dflash_config"]["target_layer_ids"]]


def _other_mask(cfg):
    cfg["dflash_config"]["mask_token_id"] = 7


def _swap_norms(w):
    w["layers.0.self_attn.q_norm.weight"], w["layers.0.self_attn.k_norm.weight"] = (
        w["layers.0.self_attn.k_norm.weight"],
        w["layers.0.self_attn.q_norm.weight"],
    )


@pytest.mark.parametrize(
    ("edit_config", "edit_weights", "says"),
    [
        (_aux_ids_as_vllm_counts, None, "does not draft as the trained drafter"),
        (_other_mask, None, "does not draft as the trained drafter"),
        (None, _swap_norms, "does not draft as the trained drafter"),
        (lambda c: c.update(block_size=3), None, "block_size 3, trained with 5"),
    ],
    ids=["target-layer-ids-off-by-one", "other-mask-token", "q-k-norms-swapped", "short-block"],
)
def test_planted_export_mistakes_are_caught(tmp_path, target, drafter, edit_config, edit_weights, says):
    folder = save_dflash(drafter, tmp_path / "d")
    _plant(folder, edit_config, edit_weights)
    with pytest.raises(ValueError, match=says):
        check_export(drafter, folder, target)


def test_a_config_for_another_target_lists_every_mismatch(target, drafter):
    cfg = drafter.engine_config() | {"num_target_layers": 30, "hidden_size": 576, "block_size": 1}
    cfg["dflash_config"] = {"mask_token_id": 10**6, "target_layer_ids": [1, 14, 26]}
    with pytest.raises(ValueError) as err:
        check_for_target(cfg, target.config, "d")
    for part in (
        "hidden_size 576",
        "num_target_layers 30",
        "target_layer_ids [1, 14, 26]",
        "mask_token_id 1000000",
        "block_size 1",
    ):
        assert part in str(err.value)


def test_vllm_loads_the_folder_itself_as_the_dflash_drafter(tmp_path, drafter):
    from specstudy.backends.vllm import speculative_config as sc

    folder = str(save_dflash(drafter, tmp_path / "d"))
    cfg = sc.speculative_config("dflash", 4, folder, {})
    assert cfg is not None and cfg["method"] == "dflash" and cfg["num_speculative_tokens"] == 4
    assert cfg["model"] == folder and sc.engine_model("/t", "dflash", folder) == "/t"  # the target as it is


@pytest.mark.slow
def test_the_committed_drafter_reads_back_as_trained_on_smollm2():
    """The committed folder for the real target: its config fits SmolLM2 and the export check passes
    against the folder itself (bf16 both sides), and its layer ids written off by one fail it."""
    from specstudy.data.model_files import load_model

    folder = "params/drafters/smollm2-135m-dflash"
    model, _ = load_model("smollm2-135m")
    draft = load_dflash(folder, model.config)
    assert draft.target_layer_ids == [1, 14, 26] and draft.block_size == 5
    check_export(draft, folder, model)
    shifted = DFlashDraft({**draft.arch, "target_layer_ids": [2, 15, 27]})
    shifted.load_state_dict(draft.state_dict())
    with pytest.raises(ValueError, match="does not draft as the trained drafter"):
        check_export(shifted, folder, model)
