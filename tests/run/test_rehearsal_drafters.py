"""Rehearsal stand-ins for the one-GPU profile's drafters (issue 46): a MiMo target carries random MTP
layers and a DFlash drafter random block layers, under the tensor names vLLM's loaders read; a drafter
whose config is not here is dropped with its rows, listed as not rehearsed (never guessed)."""

from __future__ import annotations

import json
from pathlib import Path

from specstudy.config.files import hardware_file, load_yaml
from specstudy.data.standin_drafters import _tensors, dflash_standin, mtp_target_standin
from specstudy.data.standins import scaled_config
from specstudy.run.rehearsal import heads_of, standin_targets, without_unconfigured_drafters

FIXTURES = Path(__file__).parents[1] / "fixtures" / "model_configs"


def _cfg(repo: str) -> dict:
    return json.loads((FIXTURES / repo.replace("/", "--") / "config.json").read_text())


def _read(repo: str, name: str = "config.json"):
    f = FIXTURES / repo.replace("/", "--") / name
    return json.loads(f.read_text()) if f.is_file() else None


def test_a_drafter_without_a_config_is_dropped_with_its_rows():
    study = load_yaml(hardware_file("h100-1"))["study"]
    hidden = lambda repo, name="config.json": None if repo == "amd/PARD-Llama-3.2-1B" else _read(repo, name)  # noqa: E731
    small, skipped = without_unconfigured_drafters(study, hidden)
    assert "pard" not in small["models"][0]["drafters"] and "PARD" not in {m["label"] for m in small["methods"]}
    assert "pard" not in small["models"][0]["params"] and "pard" not in small["models"][0]["vocab_size"]
    assert all("PARD" not in (sw.get("methods") or []) for sw in small["sweeps"].values())
    assert {(s["framework"], s["label"]) for s in skipped} == {("vllm", "PARD"), ("vllm-server", "PARD")}
    assert all("amd/PARD-Llama-3.2-1B has no config.json here" in s["status"] for s in skipped)
    assert heads_of(small, "dflash") == {"z-lab/Qwen3-8B-DFlash-b16": "Qwen/Qwen3-8B"}
    assert "z-lab/Qwen3-8B-DFlash-b16" not in standin_targets(small)
    assert without_unconfigured_drafters(study, _read)[1] == []  # with its config (the fixture) nothing drops


def test_mtp_and_dflash_standins_carry_vllms_tensor_names(tmp_path):
    cfg, _ = scaled_config(_cfg("XiaomiMiMo/MiMo-7B-RL"))
    mimo = mtp_target_standin(cfg, tmp_path / "mimo")
    names = set(_tensors(mimo))
    assert {"model.mtp_layers.0.input_proj.weight", "model.mtp_layers.0.mlp.down_proj.weight"} <= names
    assert not any("mtp_block" in n for n in names)  # vLLM's loader adds the wrapper itself
    conf = json.loads((mimo / "config.json").read_text())
    assert (conf["architectures"], conf["num_nextn_predict_layers"]) == (["MiMoForCausalLM"], 1)

    target, _ = scaled_config(_cfg("Qwen/Qwen3-8B"))
    folder, _ = dflash_standin(_cfg("z-lab/Qwen3-8B-DFlash-b16"), target, tmp_path / "dflash")
    t = _tensors(folder)
    conf = json.loads((folder / "config.json").read_text())
    taps = conf["dflash_config"]["target_layer_ids"]
    assert all(0 <= i < target["num_hidden_layers"] for i in taps) and conf["block_size"] == 16
    assert tuple(t["fc.weight"].shape) == (target["hidden_size"], len(taps) * target["hidden_size"])
    assert "layers.0.self_attn.q_norm.weight" in t and not any(k.startswith("model.") for k in t)
