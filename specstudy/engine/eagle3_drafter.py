"""An EAGLE-3 drafter (Li et al. 2025) in the checkpoint layout vLLM's and SGLang's loaders read.

Architecture (as both engines' ``llama_eagle3.py`` run it, ``norm_before_residual`` false):

* features: the target's residual stream entering layers ``aux_layers`` (low, middle, high:
  ``(2, L // 2, L - 3)`` for an L-layer target, the default of both engines), concatenated
  (3H) and mapped by ``fc`` (3H → H, no bias);
* ``midlayer``: one Llama decoder layer whose attention reads
  ``[input_layernorm(embed(token)); hidden_norm(h)]`` (2H), with ``h`` itself as the residual;
  the MLP as usual.  Its output before ``norm`` is the feature fed back with the next drafted
  token (then already H wide, so ``fc`` is skipped: both engines decide by the width);
* ``norm`` and ``lm_head`` over a reduced draft vocabulary (``draft_vocab_size`` rows); draft id
  i is target id ``i + d2t[i]``; ``t2d[v]`` says whether target id v is in the draft vocabulary.
  Logits outside it are −inf (vLLM's ``compute_logits``), so every draft lies in it.

Files: a folder with ``config.json`` (``architectures: ["LlamaForCausalLMEagle3"]``, the layer's
shape, ``vocab_size`` = the target's, ``draft_vocab_size``, ``tie_word_embeddings: false``) and
``model.safetensors`` with the weight names both loaders map (``fc.weight``,
``midlayer.{input_layernorm,hidden_norm,post_attention_layernorm}.weight``,
``midlayer.self_attn.{q,k,v,o}_proj.weight``, ``midlayer.mlp.{gate,up,down}_proj.weight``,
``norm.weight``, ``lm_head.weight``, ``d2t``, ``t2d``).  No ``embed_tokens``: both engines then
share the target's embedding, as this module does.  ``specstudy.json`` beside them holds the
kit's training record (the engines read neither it nor any extra key).

No ``eagle_aux_hidden_state_layer_ids`` is written: vLLM uses those ids as they are (id k = the
stream entering layer k; ``vllm/model_executor/models/interfaces.py`` ``_maybe_add_hidden_state``)
while SGLang adds one (``set_eagle3_layers_to_capture``: ``val + 1``), so a pinned list would make
the two engines read different layers; their defaults agree.  A config that pins them is read
with vLLM's meaning.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .drafters import read_folder_config
from .kv import cache_arg

ARCHITECTURE = "LlamaForCausalLMEagle3"
CONFIG_FILE, WEIGHTS_FILE, RECORD_FILE = "config.json", "model.safetensors", "specstudy.json"


def default_aux_layers(num_layers: int) -> tuple[int, int, int]:
    """vLLM's and SGLang's default feature layers for an L-layer target: (2, L // 2, L − 3)."""
    if num_layers < 7:  # below 7 the ids coincide, and vLLM collects each layer once: two features, not three
        raise ValueError(f"an EAGLE-3 target needs at least 7 layers for its default features, got {num_layers}")
    return (2, num_layers // 2, num_layers - 3)


def decoder_layer_config(arch: dict[str, Any]) -> Any:
    """A one-layer transformers Llama config of ``arch``'s shape: a drafter's KV cache, masks and rotary positions."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=1,
        hidden_size=arch["hidden_size"],
        intermediate_size=arch["intermediate_size"],
        num_hidden_layers=1,
        num_attention_heads=arch["num_attention_heads"],
        num_key_value_heads=arch["num_key_value_heads"],
        head_dim=arch["head_dim"],
        rms_norm_eps=arch["rms_norm_eps"],
        max_position_embeddings=32768,
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        rope_parameters={"rope_type": "default", "rope_theta": arch["rope_theta"]},
    )


def _midlayer_class() -> type[nn.Module]:
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm

    class Eagle3MidLayer(LlamaDecoderLayer):  # type: ignore[no-untyped-call]  # untyped in transformers
        """A Llama layer whose input is ``[embedding; feature]`` (2H); see the module docstring."""

        def __init__(self, config: Any):
            super().__init__(config, layer_idx=0)
            h, att = config.hidden_size, self.self_attn
            att.q_proj = nn.Linear(2 * h, config.num_attention_heads * config.head_dim, bias=False)
            att.k_proj = nn.Linear(2 * h, config.num_key_value_heads * config.head_dim, bias=False)
            att.v_proj = nn.Linear(2 * h, config.num_key_value_heads * config.head_dim, bias=False)
            self.hidden_norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)

        def forward(self, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            embeds, feature = hidden_states.chunk(2, dim=-1)
            x = torch.cat([self.input_layernorm(embeds), self.hidden_norm(feature)], dim=-1)
            attn, _ = self.self_attn(hidden_states=x, **kwargs)
            residual = feature + attn
            out: torch.Tensor = residual + self.mlp(self.post_attention_layernorm(residual))
            return out

    return Eagle3MidLayer


class Eagle3Draft(nn.Module):
    """``fc``, the midlayer, ``norm`` and ``lm_head`` over ``draft_vocab`` (target ids, ascending)."""

    kind = "eagle3"
    d2t: torch.Tensor  # [D] target id − draft id (a buffer)
    t2d: torch.Tensor  # [V] bool: target id in the draft vocabulary (a buffer)

    def __init__(self, arch: dict[str, Any], vocab_size: int, draft_vocab: torch.Tensor, aux_layers: tuple[int, ...]):
        super().__init__()
        from transformers import LlamaModel
        from transformers.models.llama.modeling_llama import LlamaRMSNorm

        self.arch = dict(arch)
        self.hidden_size, self.vocab_size = int(arch["hidden_size"]), int(vocab_size)
        self.aux_layers = tuple(int(i) for i in aux_layers)
        draft_vocab = torch.as_tensor(draft_vocab, dtype=torch.long)
        if draft_vocab.ndim != 1 or not bool((draft_vocab[1:] > draft_vocab[:-1]).all()):
            raise ValueError("draft_vocab: target ids in strictly ascending order")
        if len(draft_vocab) == 0 or int(draft_vocab[0]) < 0 or int(draft_vocab[-1]) >= vocab_size:
            raise ValueError(f"draft_vocab: ids must lie in [0, {vocab_size})")
        h = self.hidden_size
        self.cache_config = decoder_layer_config(self.arch)
        self.fc = nn.Linear(len(self.aux_layers) * h, h, bias=False)
        self.decoder = LlamaModel(self.cache_config)  # its KV cache, masks and rotary positions
        self.decoder.layers[0] = _midlayer_class()(self.cache_config)
        setattr(self.decoder, "norm", nn.Identity())  # noqa: B010  # typed LlamaRMSNorm: the output before ``norm`` is fed back
        self.norm = LlamaRMSNorm(h, eps=self.arch["rms_norm_eps"])
        self.lm_head = nn.Linear(h, len(draft_vocab), bias=False)
        t2d = torch.zeros(vocab_size, dtype=torch.bool)
        t2d[draft_vocab] = True
        self.register_buffer("d2t", draft_vocab - torch.arange(len(draft_vocab)))
        self.register_buffer("t2d", t2d)

    @property
    def draft_vocab(self) -> torch.Tensor:
        """Target id of each draft id ``[D]``."""
        ids: torch.Tensor = torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t
        return ids

    @classmethod
    def for_target(cls, config: Any, draft_vocab: torch.Tensor) -> Eagle3Draft:
        """Shaped like one layer of the target (a transformers Llama-style config)."""
        from .drafters import layer_shape

        arch = layer_shape(config)
        return cls(arch, int(config.vocab_size), draft_vocab, default_aux_layers(int(config.num_hidden_layers)))

    def forward(
        self,
        embeddings: torch.Tensor,
        features: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool = False,
    ) -> torch.Tensor:
        """``embeddings [B, T, H]`` of tokens j+1 and ``features [B, T, 3H]`` (the target's, through
        ``fc``) or ``[B, T, H]`` (fed back) at j → the midlayer's output ``[B, T, H]`` before ``norm``."""
        f = features.to(embeddings.dtype)
        if f.shape[-1] != self.hidden_size:
            f = self.fc(f)
        out = self.decoder(
            inputs_embeds=torch.cat([embeddings, f], dim=-1),
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            **cache_arg(self.decoder, cache),
        )
        predicted: torch.Tensor = out.last_hidden_state
        return predicted

    def draft_logits(self, predicted: torch.Tensor) -> torch.Tensor:
        """Logits over the draft vocabulary ``[..., D]``."""
        logits: torch.Tensor = self.lm_head(self.norm(predicted))
        return logits

    def target_logits(self, predicted: torch.Tensor, target: Any = None) -> torch.Tensor:
        """Logits over the target's vocabulary ``[..., V]``: −inf outside the draft vocabulary."""
        small = self.draft_logits(predicted)
        full = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.draft_vocab] = small
        return full

    # ---- the checkpoint --------------------------------------------------------------------

    def engine_config(self) -> dict[str, Any]:
        """``config.json`` as vLLM's and SGLang's EAGLE-3 loaders read it."""
        a = self.arch
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": a["hidden_size"],
            "intermediate_size": a["intermediate_size"],
            "num_attention_heads": a["num_attention_heads"],
            "num_key_value_heads": a["num_key_value_heads"],
            "head_dim": a["head_dim"],
            "num_hidden_layers": 1,
            "hidden_act": "silu",
            "rms_norm_eps": a["rms_norm_eps"],
            "rope_theta": a["rope_theta"],
            "rope_scaling": None,
            "max_position_embeddings": 8192,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": len(self.d2t),
            "target_hidden_size": a["hidden_size"],
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": "bfloat16",
            "eagle_config": {"use_aux_hidden_state": True},
        }

    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under the engines' names (bf16; d2t int64, t2d bool)."""
        out: dict[str, torch.Tensor] = {}
        # a draft vocabulary that is the whole target vocabulary has no map: vLLM's Eagle3LlamaForCausalLM
        # then has no draft_id_to_target_id and refuses a d2t (found by the rtx4090 rehearsal); the kit's
        # loader reads its absence as the identity
        full = len(self.d2t) == self.vocab_size
        for k, v in self.state_dict().items():
            if full and k in ("d2t", "t2d"):
                continue
            if k.startswith("decoder.embed_tokens") or k.startswith("decoder.rotary_emb"):
                continue
            name = k.replace("decoder.layers.0.", "midlayer.")
            out[name] = v.detach().contiguous() if k in ("d2t", "t2d") else v.detach().to(torch.bfloat16).contiguous()
        return out


def save_eagle3(module: Eagle3Draft, folder: str | Path, record: dict[str, Any] | None = None) -> Path:
    """Write ``folder``/config.json, model.safetensors and specstudy.json; returns the folder."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(module.engine_config(), indent=2) + "\n")
    save_file(module.engine_state_dict(), str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    doc = {"kind": module.kind, "aux_layers": list(module.aux_layers), **(record or {})}
    (folder / RECORD_FILE).write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return folder


def check_round_trip(module: Eagle3Draft, folder: str | Path, target_config: Any, seed: int = 0) -> None:
    """Reload ``folder`` as the engines read it and compare it with the trained ``module``.

    A mistake in the export (the vocabulary map, the feature layers, a weight left out) reaches
    every engine alike, so no comparison between engines sees it; this does.  Compares ``d2t``, the
    feature layers an engine will capture, and the draft logits of both on random inputs (the
    checkpoint holds bf16 weights: argmax agreement and a bf16-sized tolerance).  Raises
    ValueError naming every difference.
    """
    try:
        back = load_eagle3(folder, target_config)
    except ValueError as e:
        raise ValueError(f"{folder}: the export does not load back: {e}") from None
    problems = []
    if not torch.equal(back.draft_vocab.cpu(), module.draft_vocab.cpu()):
        n = int((back.draft_vocab.cpu() != module.draft_vocab.cpu()).sum()) if len(back.d2t) == len(module.d2t) else -1
        problems.append(f"d2t maps {n if n >= 0 else 'all'} draft ids to other target ids than the trained head's")
    if back.aux_layers != module.aux_layers:
        problems.append(
            f"engines capture layers {list(back.aux_layers)}, the head was trained on {list(module.aux_layers)}"
        )
    if not problems and not _same_logits(module, back, seed):
        problems.append("the reloaded head's draft logits differ from the trained head's beyond bf16 rounding")
    if problems:
        raise ValueError(f"{folder}: " + "; ".join(problems))


@torch.no_grad()
def _same_logits(a: Eagle3Draft, b: Eagle3Draft, seed: int) -> bool:
    """Both heads on the same random (embedding, features) inputs: argmax mostly equal and logits close."""
    gen = torch.Generator().manual_seed(seed)
    h, n = a.hidden_size, len(a.aux_layers)
    e, f = torch.randn(1, 16, h, generator=gen), torch.randn(1, 16, n * h, generator=gen)
    pos = torch.arange(16)[None]
    a, b = copy.deepcopy(a).float(), b.float()  # the trained head stays as it is
    la, lb = a.draft_logits(a(e, f, position_ids=pos)), b.draft_logits(b(e, f, position_ids=pos))
    agree = float((la.argmax(-1) == lb.argmax(-1)).float().mean())
    return agree >= 0.9 and bool(torch.allclose(la, lb, rtol=0.05, atol=0.05 * float(la.abs().max())))


def read_eagle3_config(folder: str | Path) -> dict[str, Any]:
    """config.json of an EAGLE-3 folder; a ValueError naming the file unless it is one."""
    return read_folder_config(folder, ARCHITECTURE, "num_hidden_layers", "eagle3", CONFIG_FILE, WEIGHTS_FILE)


def pinned_aux_layers(cfg: dict[str, Any]) -> tuple[int, ...] | None:
    """``eagle_aux_hidden_state_layer_ids`` (top level, else in ``eagle_config``), vLLM's meaning."""
    ids = cfg.get("eagle_aux_hidden_state_layer_ids") or (cfg.get("eagle_config") or {}).get(
        "eagle_aux_hidden_state_layer_ids"
    )
    return tuple(int(i) for i in ids) if ids else None


def load_eagle3(folder: str | Path, target_config: Any) -> Eagle3Draft:
    """The drafter of an EAGLE-3 folder for a target (checks width, vocabulary and layers)."""
    from safetensors.torch import load_file

    cfg = read_eagle3_config(folder)
    if int(cfg.get("target_hidden_size", cfg["hidden_size"])) != int(target_config.hidden_size):
        raise ValueError(f"{folder}: target_hidden_size does not match the target's {target_config.hidden_size}")
    if int(cfg["vocab_size"]) != int(target_config.vocab_size):
        raise ValueError(f"{folder}: vocab_size {cfg['vocab_size']} is not the target's {target_config.vocab_size}")
    weights = load_file(str(Path(folder) / WEIGHTS_FILE))
    d2t = weights.pop("d2t", None)
    weights.pop("t2d", None)
    draft_vocab = torch.arange(int(cfg["vocab_size"])) if d2t is None else torch.arange(len(d2t)) + d2t.long()
    layers = pinned_aux_layers(cfg) or default_aux_layers(int(target_config.num_hidden_layers))
    arch = {k: cfg[k] for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")}
    arch.update(
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]),
        rope_theta=float(cfg.get("rope_theta", 10000.0)),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
    )
    module = Eagle3Draft(arch, int(cfg["vocab_size"]), draft_vocab, layers)
    state = {k.replace("midlayer.", "decoder.layers.0."): v.float() for k, v in weights.items()}
    missing, unexpected = module.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.startswith("decoder.embed_tokens") and k not in ("d2t", "t2d")]
    if missing or unexpected:
        raise ValueError(f"{folder}: weights missing {missing}, unexpected {unexpected}")
    return module.eval()
