"""A multi-token-prediction (MTP) layer for a Llama-style target, in MiMo's layout (Xiaomi 2025).

What one MTP layer computes (vLLM's ``mimo_mtp.py``, ``MiMoMultiTokenPredictorLayer``), for the
pair (h_j, token j+1) at position j:

* ``e = embed(token j+1)``, zero at position 0 (vLLM masks it there);
* ``x = input_proj([hidden_layernorm(h_j); token_layernorm(e)])`` (2H → H, no bias): the
  hidden state first, the embedding second;
* one decoder layer (``mtp_block``: a Qwen2 layer, whose zero q/k/v biases make it a Llama
  layer) on ``x``, then ``final_layernorm``; the target's LM head turns that into the logits of
  token j+2, and the same vector is fed back as h with the next drafted token.

``h_j`` is the target's residual stream after its last layer, *before* its final norm (vLLM's
``MiMoModel.forward`` returns ``hidden_states + residual`` and norms only in ``compute_logits``).

Files: a folder with ``config.json`` (the layer's shape; ``num_nextn_predict_layers``) and
``model.safetensors`` holding exactly the tensors a MiMo checkpoint stores for its MTP layers
(``model.mtp_layers.{i}.{token_layernorm,hidden_layernorm,input_proj,final_layernorm}.weight``,
``model.mtp_layers.{i}.self_attn.{q,k,v,o}_proj...``, ``.mlp...``, ``.input_layernorm``,
``.post_attention_layernorm``), bf16; :mod:`specstudy.backends.vllm.mimo_export` puts them beside
the target's layers as the MiMo model vLLM runs with ``method: mtp``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .drafters import read_folder_config
from .kv import cache_arg

ARCHITECTURE = "SpecstudyMtpLayers"
CONFIG_FILE, WEIGHTS_FILE, RECORD_FILE = "config.json", "model.safetensors", "specstudy.json"
#: the MTP layer's own tensors (beside its decoder layer's), as MiMo's checkpoint names them
OWN = ("token_layernorm", "hidden_layernorm", "input_proj", "final_layernorm")


def _mtp_layer_class() -> type[nn.Module]:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

    class MtpLayer(LlamaDecoderLayer):  # type: ignore[no-untyped-call]  # untyped in transformers
        """A decoder layer whose input is ``[embedding; hidden]`` (2H); see the module docstring."""

        def __init__(self, config: Any):
            super().__init__(config, layer_idx=0)
            h, eps = config.hidden_size, config.rms_norm_eps
            self.token_layernorm = LlamaRMSNorm(h, eps=eps)
            self.hidden_layernorm = LlamaRMSNorm(h, eps=eps)
            self.input_proj = nn.Linear(2 * h, h, bias=False)
            self.final_layernorm = LlamaRMSNorm(h, eps=eps)

        def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            embeds, hidden = hidden_states.chunk(2, dim=-1)
            positions = kwargs.get("position_ids")
            if positions is not None:
                embeds = torch.where(positions[..., None] == 0, torch.zeros_like(embeds), embeds)
            x = self.input_proj(torch.cat([self.hidden_layernorm(hidden), self.token_layernorm(embeds)], dim=-1))
            y = super().forward(x, **kwargs)
            out: torch.Tensor = self.final_layernorm(y[0] if isinstance(y, tuple) else y)
            return out

    return MtpLayer


class MtpDraft(nn.Module):
    """One MTP layer (``decoder.layers[0]``) driven like the kit's EAGLE drafters: embeddings of
    tokens j+1 and features h_j in, the vector the target's LM head reads out (and fed back)."""

    kind = "mtp"

    def __init__(self, arch: dict[str, Any]):
        super().__init__()
        from transformers import LlamaModel

        from .eagle3_drafter import decoder_layer_config

        self.arch = dict(arch)
        self.hidden_size = int(arch["hidden_size"])
        self.cache_config = decoder_layer_config(self.arch)
        self.fc = nn.Identity()  # the features are H wide already (the training loop shares EAGLE-3's)
        self.decoder = LlamaModel(self.cache_config)  # its KV cache, masks and rotary positions
        self.decoder.layers[0] = _mtp_layer_class()(self.cache_config)
        setattr(self.decoder, "norm", nn.Identity())  # noqa: B010  # the layer ends in its own final_layernorm

    @property
    def layer(self) -> nn.Module:
        return self.decoder.layers[0]

    @classmethod
    def for_target(cls, config: Any) -> MtpDraft:
        """Shaped like one layer of the target (a transformers Llama-style config)."""
        from .drafters import layer_shape

        return cls(layer_shape(config))

    def forward(
        self,
        embeddings: torch.Tensor,
        features: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool = False,
    ) -> torch.Tensor:
        """``embeddings [B, T, H]`` of tokens j+1, ``features [B, T, H]`` (h_j) → ``[B, T, H]``."""
        out = self.decoder(
            inputs_embeds=torch.cat([embeddings, features.to(embeddings.dtype)], dim=-1),
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            **cache_arg(self.decoder, cache),
        )
        predicted: torch.Tensor = out.last_hidden_state
        return predicted

    def target_logits(self, predicted: torch.Tensor, target: Any) -> torch.Tensor:
        """The target's LM head on the layer's output (MiMo shares the target's head)."""
        logits: torch.Tensor = target.get_output_embeddings()(predicted)
        return logits

    # ---- the files -------------------------------------------------------------------------

    def engine_state_dict(self, index: int = 0) -> dict[str, torch.Tensor]:
        """The layer's tensors under MiMo's checkpoint names (bf16)."""
        out = {}
        for k, v in self.layer.state_dict().items():
            out[f"model.mtp_layers.{index}.{k}"] = v.detach().to(torch.bfloat16).contiguous()
        return out


def save_mtp(module: MtpDraft, folder: str | Path, record: dict[str, Any] | None = None) -> Path:
    """Write ``folder``/config.json, model.safetensors and specstudy.json; returns the folder."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [ARCHITECTURE], "num_nextn_predict_layers": 1, **module.arch}
    (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    save_file(module.engine_state_dict(), str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / RECORD_FILE).write_text(json.dumps({"kind": "mtp", **(record or {})}, indent=2, default=str) + "\n")
    return folder


def read_mtp_config(folder: str | Path) -> dict[str, Any]:
    """config.json of an MTP folder; a ValueError naming the file unless it is one."""
    return read_folder_config(folder, ARCHITECTURE, "num_nextn_predict_layers", "mtp", CONFIG_FILE, WEIGHTS_FILE)


def mtp_from_state(arch: dict[str, Any], weights: dict[str, torch.Tensor], where: str, index: int = 0) -> MtpDraft:
    """An MTP layer from MiMo-named tensors (layer ``index``); every tensor must be used and present.
    q/k/v biases (a MiMo checkpoint's Qwen2 layer has them) must be zero: this is a Llama layer."""
    module = MtpDraft(arch)
    prefix = f"model.mtp_layers.{index}."
    state = {k[len(prefix) :]: v.float() for k, v in weights.items() if k.startswith(prefix)}
    biases = [k for k in state if k.endswith("_proj.bias") and ".self_attn." in f".{k}"]
    nonzero = [k for k in biases if bool(state[k].any())]
    if nonzero:
        raise ValueError(f"{where}: MTP layer {index}: non-zero attention biases {nonzero} (a Llama layer has none)")
    state = {k: v for k, v in state.items() if k not in biases}
    missing, unexpected = module.layer.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{where}: MTP layer {index}: weights missing {missing}, unexpected {unexpected}")
    return module.eval()


def load_mtp(folder: str | Path, target_config: Any) -> MtpDraft:
    """The MTP layer of a folder for a target (checks the width against the target's)."""
    from safetensors.torch import load_file

    cfg = read_mtp_config(folder)
    if int(cfg["hidden_size"]) != int(target_config.hidden_size):
        raise ValueError(f"{folder}: hidden_size {cfg['hidden_size']} is not the target's {target_config.hidden_size}")
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    arch = {k: int(cfg[k]) for k in keys} | {k: float(cfg[k]) for k in ("rope_theta", "rms_norm_eps")}
    return mtp_from_state(arch, load_file(str(Path(folder) / WEIGHTS_FILE)), str(folder))
