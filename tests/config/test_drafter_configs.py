"""The one-GPU profile against its models' own configs (issue 46): the shipped h100-1 passes; a DFlash
block shorter than γ + 1, aux layers or DFlash taps past the target's depth, a head trained for another
verifier, MTP on a target without MTP layers and a PARD drafter without its token are each refused,
naming the model, the key and what is allowed."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from specstudy.config import load_study
from specstudy.config.drafter_configs import drafter_problems, layer_view
from specstudy.config.model_configs import Use, config_problems, read_config

FIXTURES = Path(__file__).parents[1] / "fixtures" / "model_configs"


@pytest.fixture(autouse=True)
def fixture_configs(monkeypatch):
    monkeypatch.setenv("SPECSTUDY_MODEL_CONFIGS", str(FIXTURES))


def _cfg(model: str) -> dict:
    return json.loads((FIXTURES / model.replace("/", "--") / "config.json").read_text())


def _use(method: str, target: str, drafter: str | None, gammas=(3,)) -> Use:
    return Use("vllm", method, target, drafter, 1, "bfloat16", 16384, 0.9, tuple(gammas))


def test_the_one_gpu_profile_passes_its_configs():
    cfg = load_study("h100-1", check_tokenizers=False)
    problems, unchecked = config_problems(cfg, 80)
    assert problems == []
    assert unchecked == []  # every drafter's config here, PARD's with its pard_token


def test_a_speculators_head_reads_like_a_plain_one():
    head = layer_view(_cfg("RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3"))
    assert (head["hidden_size"], head["vocab_size"], head["max_position_embeddings"]) == (4096, 128256, 131072)
    assert head["draft_vocab_size"] == 32000


def test_a_dflash_block_bounds_gamma():
    d, t = _cfg("z-lab/Qwen3-8B-DFlash-b16"), _cfg("Qwen/Qwen3-8B")
    assert drafter_problems("f", _use("dflash", "Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", (3, 15)), t, d) == []
    (p,) = drafter_problems("f", _use("dflash", "Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16", (4, 16)), t, d)
    assert p.value == [16] and "<= 15" in str(p) and "block_size=16" in str(p)


def test_a_dflash_drafter_for_another_target_is_refused():
    d, t = _cfg("z-lab/Qwen3-8B-DFlash-b16"), _cfg("Qwen/Qwen3-0.6B")  # 28 layers, the drafter taps layer 33
    msgs = [str(p) for p in drafter_problems("f", _use("dflash", "Qwen/Qwen3-0.6B", "z-lab/Qwen3-8B-DFlash-b16"), t, d)]
    assert any("target_layer_ids=[1, 9, 17, 25, 33]" in m and "0..27" in m for m in msgs)
    assert any("num_target_layers=36" in m for m in msgs)
    d2 = copy.deepcopy(d)
    del d2["dflash_config"]["mask_token_id"]
    msgs = [
        str(p) for p in drafter_problems("f", _use("dflash", "Qwen/Qwen3-8B", "x/dflash"), _cfg("Qwen/Qwen3-8B"), d2)
    ]
    assert any("mask_token_id" in m for m in msgs)


def test_an_eagle3_head_for_another_verifier_or_depth_is_refused():
    t = _cfg("meta-llama/Llama-3.1-8B-Instruct")
    d = _cfg("RedHatAI/Qwen3-8B-speculator.eagle3")
    d["eagle_aux_hidden_state_layer_ids"] = [2, 18, 33]
    msgs = [str(p) for p in drafter_problems("f", _use("eagle3", "meta-llama/Llama-3.1-8B-Instruct", "x/h"), t, d)]
    assert any("verifier.name_or_path='Qwen/Qwen3-8B'" in m for m in msgs)
    assert any("eagle_aux_hidden_state_layer_ids=[2, 18, 33]" in m and "0..31" in m for m in msgs)


def test_mtp_needs_a_target_that_ships_mtp_layers():
    assert drafter_problems("f", _use("mtp", "XiaomiMiMo/MiMo-7B-RL", None), _cfg("XiaomiMiMo/MiMo-7B-RL"), None) == []
    (p,) = drafter_problems("f", _use("mtp", "Qwen/Qwen3-8B", None), _cfg("Qwen/Qwen3-8B"), None)
    assert "num_nextn_predict_layers" in str(p) and "Qwen/Qwen3-8B" in str(p)


def test_pard_needs_its_parallel_drafting_token():
    plain = _cfg("meta-llama/Llama-3.2-1B-Instruct")
    (p,) = drafter_problems("f", _use("pard", "meta-llama/Llama-3.1-8B-Instruct", "x/pard"), {}, plain)
    assert "pard_token" in str(p)
    assert drafter_problems("f", _use("pard", "t", "x/pard"), {}, {**plain, "pard_token": 128011}) == []


def test_fixtures_are_read_as_published_files():
    assert read_config("XiaomiMiMo/MiMo-7B-RL")["num_nextn_predict_layers"] == 1
