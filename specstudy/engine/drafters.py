"""Small trained drafters for a target that has no smaller sibling: architectures and files.

The engine loads and runs these; :mod:`specstudy.train` distils them from the target:

* ``heads`` — Medusa-style heads (Cai et al. 2024).  Head k (k = 1..K) reads the target's last
  hidden state h_t (after the final norm) and predicts token t+1+k through residual blocks
  x + SiLU(W x + b) followed by the target's own frozen LM head, so only the blocks are stored
  (K × (H² + H) parameters per block: 4 one-block heads of SmolLM2-135M ≈ 5.3 MB in fp32).
  ``token_conditioned`` heads (Hydra-style, Ankner et al. 2024) also read the embedding of the
  token just before the one they predict, through a first block on [h; e] (2H² + H more).
* ``layer_skip_adapter`` — self-speculation helper: the hidden state after the first ``exit_layer``
  layers goes through a residual block, then the target's final norm and LM head, trained to
  predict the target's next-token distribution (what plain early exit only approximates).
* ``eagle`` — EAGLE-style feature drafter (Li et al. 2024): one decoder layer (transformers'
  Llama layer, the target's attention shape) reads, per position j, the target's last hidden
  state f_j and the embedding of token j+1 (through a linear map of [e; f]) and predicts
  f_{j+1}; the target's LM head turns it into token j+2.  Drafting feeds its own predicted
  feature back in, so it drafts autoregressively at the feature level with its own KV cache.

Files: ``<name>.safetensors`` (weights, with the architecture in the safetensors metadata) and
``<name>.json`` (command, settings, training log, held-out acceptance).  The writer
(:func:`save_drafter`) stays beside the reader (:func:`load_drafter`) so the file format lives
in one module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..paths import REPO_ROOT  # drafter paths may be given relative to the repository
from .kv import cache_arg

#: eagle3 and mtp: their own folder layouts (engine/eagle3_drafter.py, engine/mtp_drafter.py)
KINDS = ("heads", "layer_skip_adapter", "eagle", "eagle3", "mtp", "dflash")

# --------------------------------------------------------------------------------------------
# architectures


class ResBlock(nn.Module):
    """x + SiLU(W x + b), W initialised to zero so an untrained block is the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(x))


class TokenResBlock(nn.Module):
    """h + SiLU(W [h; e] + b): mixes in the embedding e of the token just before the one to predict
    (Hydra-style sequential dependence); W zero-initialised, so untrained it is the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(2 * hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.silu(self.linear(torch.cat([x, e.to(x.dtype)], dim=-1)))


class MedusaHeads(nn.Module):
    """K heads on the target's last hidden state h_t; head k predicts token t+1+k.

    Plain (Medusa): head k is ``num_layers`` residual blocks on h_t.  ``token_conditioned``
    (Hydra-style): head k's first block also reads the embedding of token t+k, the token right
    before the one it predicts — the pending token for head 1, the previous head's draft after
    that — so drafting runs head by head.  The LM head and the embedding are the target's
    (frozen, passed at call time): a head file holds only the blocks.
    """

    kind = "heads"

    def __init__(self, hidden_size: int, num_heads: int, num_layers: int = 1, token_conditioned: bool = False):
        super().__init__()
        if num_heads < 1 or num_layers < 1:
            raise ValueError(f"num_heads={num_heads!r} and num_layers={num_layers!r} must be >= 1")
        self.hidden_size, self.num_heads, self.num_layers = hidden_size, num_heads, num_layers
        self.token_conditioned = bool(token_conditioned)
        self.blocks = nn.ModuleList(
            [
                nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers - int(self.token_conditioned))])
                for _ in range(num_heads)
            ]
        )
        self.token_blocks = nn.ModuleList(
            [TokenResBlock(hidden_size) for _ in range(num_heads)] if self.token_conditioned else []
        )

    def config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "hidden_size": self.hidden_size,
            "num_heads": self.num_heads,
            "num_layers": self.num_layers,
            "token_conditioned": int(self.token_conditioned),
        }

    def vectors(self, head: int, hidden: torch.Tensor, prev_embedding: torch.Tensor | None = None) -> torch.Tensor:
        """Head ``head`` (0-based) at ``hidden [..., H]`` → the vector the LM head reads.

        ``prev_embedding [..., H]``: the embedding of the token before the predicted one (needed
        when token-conditioned, ignored otherwise).
        """
        x = hidden
        if self.token_conditioned:
            if prev_embedding is None:
                raise ValueError("token-conditioned heads need the previous token's embedding")
            x = self.token_blocks[head](x, prev_embedding)
        vectors: torch.Tensor = self.blocks[head](x)
        return vectors


class LayerSkipAdapter(nn.Module):
    """Residual blocks mapping the hidden state after ``exit_layer`` layers towards the last one."""

    kind = "layer_skip_adapter"

    def __init__(self, hidden_size: int, exit_layer: int, num_layers: int = 1):
        super().__init__()
        if exit_layer < 1 or num_layers < 1:
            raise ValueError(f"exit_layer={exit_layer!r} and num_layers={num_layers!r} must be >= 1")
        self.hidden_size, self.exit_layer, self.num_layers = hidden_size, exit_layer, num_layers
        self.blocks = nn.Sequential(*[ResBlock(hidden_size) for _ in range(num_layers)])

    def config(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "hidden_size": self.hidden_size,
            "exit_layer": self.exit_layer,
            "num_layers": self.num_layers,
        }

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Hidden after ``exit_layer`` layers (pre-norm) → a hidden state for the final norm and LM
        head (the ``adapter`` option of :mod:`specstudy.engine.methods.layer_skip`)."""
        adapted: torch.Tensor = self.blocks(hidden)
        return adapted


def layer_shape(config: Any) -> dict[str, Any]:
    """One decoder layer's shape from a Llama-style target's transformers config (EagleDraft's
    arguments; EAGLE-3's midlayer too)."""
    rope = getattr(config, "rope_parameters", None) or {}
    return {
        "hidden_size": int(config.hidden_size),
        "intermediate_size": int(config.intermediate_size),
        "num_attention_heads": int(config.num_attention_heads),
        "num_key_value_heads": int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads),
        "head_dim": int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads),
        "rope_theta": float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
        "rms_norm_eps": float(getattr(config, "rms_norm_eps", 1e-5)),
    }


class EagleDraft(nn.Module):
    """One decoder layer over (feature, next token) pairs: ``f_j, e_{j+1} → f̂_{j+1}``.

    ``fc`` maps [e; f] (2H) to H, initialised to pass f through; ``decoder`` is a one-layer
    ``LlamaModel`` (its embedding table is unused, vocab 1) with the target's head layout, so
    the KV cache, rotary positions and masks are transformers' own.  Its output (after the
    decoder's own norm) is what the target's LM head reads.
    """

    kind = "eagle"

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_attention_heads: int,
        num_key_value_heads: int,
        head_dim: int,
        rope_theta: float = 10000.0,
        rms_norm_eps: float = 1e-5,
    ):
        super().__init__()
        from transformers import LlamaConfig, LlamaModel

        self.arch = {
            "hidden_size": int(hidden_size),
            "intermediate_size": int(intermediate_size),
            "num_attention_heads": int(num_attention_heads),
            "num_key_value_heads": int(num_key_value_heads),
            "head_dim": int(head_dim),
            "rope_theta": float(rope_theta),
            "rms_norm_eps": float(rms_norm_eps),
        }
        self.hidden_size = int(hidden_size)
        self.cache_config = LlamaConfig(
            vocab_size=1,
            hidden_size=hidden_size,
            intermediate_size=intermediate_size,
            num_hidden_layers=1,
            num_attention_heads=num_attention_heads,
            num_key_value_heads=num_key_value_heads,
            head_dim=head_dim,
            rms_norm_eps=rms_norm_eps,
            max_position_embeddings=32768,
            pad_token_id=None,
            bos_token_id=None,
            eos_token_id=None,
            rope_parameters={"rope_type": "default", "rope_theta": rope_theta},
        )
        self.fc = nn.Linear(2 * hidden_size, hidden_size)
        with torch.no_grad():
            self.fc.weight.zero_()
            self.fc.weight[:, hidden_size:] = torch.eye(hidden_size)
            self.fc.bias.zero_()
        self.decoder = LlamaModel(self.cache_config)

    @classmethod
    def for_target(cls, config: Any) -> EagleDraft:
        """Shaped like one layer of the target (transformers config of a Llama-style model)."""
        return cls(**layer_shape(config))

    def config(self) -> dict[str, Any]:
        return {"kind": self.kind, **self.arch}

    def forward(
        self,
        embeddings: torch.Tensor,
        features: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool = False,
    ) -> torch.Tensor:
        """``embeddings [B, T, H]`` of tokens j+1 and ``features [B, T, H]`` f_j → f̂_{j+1} ``[B, T, H]``."""
        x = self.fc(torch.cat([embeddings, features.to(embeddings.dtype)], dim=-1))
        out = self.decoder(
            inputs_embeds=x,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=use_cache,
            **cache_arg(self.decoder, cache),
        )
        predicted: torch.Tensor = out.last_hidden_state
        return predicted

    def target_logits(self, predicted: torch.Tensor, target: Any) -> torch.Tensor:
        """The target's LM head on the predicted feature (the target's vocabulary)."""
        logits: torch.Tensor = target.get_output_embeddings()(predicted)
        return logits


#: a drafter module of one of :data:`KINDS` (what :func:`build_drafter` and :func:`load_drafter` return)
TrainedDrafter = MedusaHeads | LayerSkipAdapter | EagleDraft


def build_drafter(config: dict[str, Any]) -> TrainedDrafter:
    kind = config.get("kind")
    if kind == "eagle":
        return EagleDraft(
            int(config["hidden_size"]),
            int(config["intermediate_size"]),
            int(config["num_attention_heads"]),
            int(config["num_key_value_heads"]),
            int(config["head_dim"]),
            float(config["rope_theta"]),
            float(config["rms_norm_eps"]),
        )
    if kind == "heads":
        return MedusaHeads(
            int(config["hidden_size"]),
            int(config["num_heads"]),
            int(config.get("num_layers", 1)),
            bool(int(config.get("token_conditioned", 0))),
        )
    if kind == "layer_skip_adapter":
        return LayerSkipAdapter(int(config["hidden_size"]), int(config["exit_layer"]), int(config.get("num_layers", 1)))
    raise ValueError(f"drafter kind={kind!r}: allowed {KINDS}")


# --------------------------------------------------------------------------------------------
# files


def resolve_drafter_path(name: str | Path) -> Path:
    """A drafter file by path: as given (from the working directory), else relative to the
    repository root, so ``params/drafters/...`` works from notebooks/ too; ``.safetensors`` added."""
    p = Path(name).expanduser()
    if p.suffix != ".safetensors":
        p = p.with_suffix(".safetensors")
    if not p.exists() and not p.is_absolute() and (Path(REPO_ROOT) / p).exists():
        p = Path(REPO_ROOT) / p
    return p


def drafter_file_metadata(name: str | Path, kind: str) -> dict[str, str]:
    """The metadata of drafter file ``name``, which must exist and hold ``kind`` (a method's check
    before any model is loaded: a ValueError naming the file and the kind found)."""
    from safetensors import safe_open

    p = resolve_drafter_path(str(name))
    if not p.exists():
        raise ValueError(
            f"drafter={name!r}: no {kind} file at {str(p)!r} (train one with `specstudy train-drafter --kind {kind}`)"
        )
    with safe_open(str(p), framework="pt") as f:
        meta = dict(f.metadata() or {})
    if meta.get("kind") != kind:
        raise ValueError(f"drafter={name!r} holds drafter kind {meta.get('kind')!r}, not {kind!r}")
    return meta


def save_drafter(module: TrainedDrafter, path: str | Path, target: str, info: dict[str, Any] | None = None) -> Path:
    """Write ``path`` (.safetensors, fp32, architecture + target in the metadata) and a .json beside it."""
    from safetensors.torch import save_file

    path = Path(path).with_suffix(".safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {k: str(v) for k, v in module.config().items()}
    meta["target"] = target
    tensors = {k: v.detach().to(torch.float32).contiguous() for k, v in module.state_dict().items()}
    save_file(tensors, str(path), metadata=meta)
    doc = {"weights": path.name, "target": target, "architecture": module.config(), **(info or {})}
    path.with_suffix(".json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path


def load_drafter(
    path: str | Path, kind: str | None = None, target: str | None = None, hidden_size: int | None = None
) -> TrainedDrafter:
    """Load a drafter file; refuse one built for another kind, target or hidden size."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    p = resolve_drafter_path(path)
    if not p.exists():
        raise FileNotFoundError(f"drafter weights {str(p)!r} not found (train one with `specstudy train-drafter`)")
    with safe_open(str(p), framework="pt") as f:
        meta = dict(f.metadata() or {})
    if "kind" not in meta:
        raise ValueError(f"{p}: no drafter metadata (kind) — not written by specstudy.engine.drafters")
    if kind is not None and meta["kind"] != kind:
        raise ValueError(f"{p}: drafter kind {meta['kind']!r}, but {kind!r} is needed")
    if target is not None and meta.get("target") not in (None, "", target):
        raise ValueError(f"{p}: trained for target {meta.get('target')!r}, not {target!r}")
    if hidden_size is not None and int(meta["hidden_size"]) != hidden_size:
        raise ValueError(f"{p}: hidden_size {meta['hidden_size']} does not match the target's {hidden_size}")
    module = build_drafter(meta)
    module.load_state_dict(load_file(str(p)))
    return module.eval()


def read_folder_config(
    folder: str | Path, architecture: str, layers_key: str, kind: str, config_file: str, weights_file: str
) -> dict[str, Any]:
    """config.json of a one-layer drafter folder (EAGLE-3, MTP): a ValueError naming the file unless it
    declares ``architecture`` with one layer under ``layers_key`` and holds ``weights_file``."""
    p = Path(folder) / config_file
    if not p.is_file():
        raise ValueError(
            f"drafter={str(folder)!r}: no {config_file} (train one with `specstudy train-drafter --kind {kind}`)"
        )
    cfg: dict[str, Any] = json.loads(p.read_text())
    if architecture not in (cfg.get("architectures") or []):
        raise ValueError(f"{p}: architectures {cfg.get('architectures')!r}, not [{architecture!r}]")
    if int(cfg.get(layers_key, 1)) != 1:
        raise ValueError(f"{p}: {layers_key}={cfg[layers_key]}; the kit runs one layer")
    if not (Path(folder) / weights_file).is_file():
        raise ValueError(f"drafter={str(folder)!r}: no {weights_file}")
    return cfg
