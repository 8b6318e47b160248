"""§1: a profile's Medusa heads get random stand-ins in FasterDecoding's checkpoint format (the names
vLLM's Medusa loader remaps and TensorRT-LLM's converter reads), shaped for the stand-in target."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoConfig

from specstudy.run.rehearsal import build_standins, heads_of

FIXTURES = Path(__file__).parents[1] / "fixtures" / "model_configs"
TARGET, HEAD = "lmsys/vicuna-33b-v1.3", "FasterDecoding/medusa-vicuna-33b-v1.3"
STUDY = {
    "models": [{"name": "v33", "target": TARGET, "drafters": {"medusa": HEAD}}],
    "methods": [{"method": "medusa", "label": "Medusa (chain)", "drafter": "medusa", "frameworks": ["trtllm-engine"]}],
}


def test_medusa_heads_are_random_heads_in_their_checkpoint_format_for_the_stand_in(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECSTUDY_MODEL_CONFIGS", str(FIXTURES))
    assert heads_of(STUDY, "medusa") == {HEAD: TARGET} and heads_of(STUDY) == {}
    cache = tmp_path / "hub"
    notes = build_standins(STUDY, cache)
    target = AutoConfig.from_pretrained(str(next((cache / "models--lmsys--vicuna-33b-v1.3" / "snapshots").iterdir())))
    snap = next((cache / "models--FasterDecoding--medusa-vicuna-33b-v1.3" / "snapshots").iterdir())
    real = json.loads((FIXTURES / "FasterDecoding--medusa-vicuna-33b-v1.3" / "config.json").read_text())
    cfg = json.loads((snap / "config.json").read_text())
    heads, layers = real["medusa_num_heads"], real["medusa_num_layers"]
    assert (cfg["medusa_num_heads"], cfg["medusa_num_layers"], cfg["base_model_name_or_path"]) == (
        heads,
        layers,
        TARGET,
    )
    assert (cfg["hidden_size"], cfg["vocab_size"]) == (target.hidden_size, target.vocab_size)
    pt, st = torch.load(snap / "medusa_lm_head.pt"), load_file(str(snap / "model.safetensors"))
    assert set(pt) == set(st) and len(pt) == heads * (2 * layers + 1)
    h = target.hidden_size
    for i in range(heads):
        for j in range(layers):
            assert pt[f"{i}.{j}.linear.weight"].shape == (h, h) and pt[f"{i}.{j}.linear.bias"].shape == (h,)
        assert pt[f"{i}.{layers}.weight"].shape == (target.vocab_size, h)
    assert f"{heads} heads" in notes[HEAD][0]
