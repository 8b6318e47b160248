"""A DFlash block drafter (Chen et al. 2025) in the checkpoint layout vLLM's ``dflash`` method loads.

What it computes (vLLM 0.32 ``qwen3_dflash.py``, ``DFlashQwen3ForCausalLM``; ``v1/spec_decode/dflash.py``):

* context: for every position j whose target pass is done, the target's residual streams after its
  layers ``target_layer_ids`` (DFlash's ids: id i = the output of layer i, which vLLM captures as
  its aux hidden state i + 1), concatenated and mapped by ``fc`` (nH → H, no bias), then
  ``hidden_norm``; each draft layer projects that to its own keys and values (``k_proj``,
  ``k_norm``, RoPE at j; ``v_proj``) — the context never runs through the layers;
* query: one block of ``1 + γ`` embeddings at positions n .. n + γ: the last committed token (the
  target's pending token, whose own pass is still to come) and γ copies of ``mask_token_id``;
* Qwen3 decoder layers (``q_norm``/``k_norm`` per head, no bias) whose attention sees the whole
  context and the whole block (no causal mask inside it), then ``norm``; the target's LM head on
  the γ mask slots gives the γ drafts at once: one drafter forward per block, whatever γ.

Files: a folder with ``config.json`` (``architectures: ["DFlashDraftModel"]``, ``model_type:
qwen3``, the layers' shape, ``block_size``, ``num_target_layers``, ``dflash_config:
{mask_token_id, target_layer_ids}``) and ``model.safetensors`` with ``fc.weight``,
``hidden_norm.weight``, ``layers.{i}.…`` (Qwen3 names) and ``norm.weight``, bf16.  No
``embed_tokens`` nor ``lm_head``: vLLM then shares the target's, as this module does.
``specstudy.json`` holds the kit's training record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .drafters import read_folder_config

ARCHITECTURE = "DFlashDraftModel"
CONFIG_FILE, WEIGHTS_FILE, RECORD_FILE = "config.json", "model.safetensors", "specstudy.json"
#: the shape keys a folder's config must hold (ints, then floats)
SHAPE_INTS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
SHAPE_FLOATS = ("rope_theta", "rms_norm_eps")


def default_target_layers(num_layers: int) -> list[int]:
    """EAGLE-3's feature layers (the streams entering 2, L // 2, L − 3) in DFlash's numbering
    (id i = the output of layer i): the same three streams, so both drafters read the same target."""
    from .eagle3_drafter import default_aux_layers

    return [k - 1 for k in default_aux_layers(num_layers)]


class RMSNorm(nn.Module):
    """x / rms(x) · w, in float32 (vLLM's and transformers' kernels both compute it so)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Neox-style rotary embedding of ``x [B, T, heads, d]`` at ``pos [B, T]`` (Llama's and Qwen3's)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[..., None] * inv  # [B, T, d/2]
    cos, sin = torch.cat([ang, ang], -1).cos()[:, :, None], torch.cat([ang, ang], -1).sin()[:, :, None]
    half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], dim=-1)
    return (x.float() * cos + half.float() * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, a: dict[str, Any]):
        super().__init__()
        h, self.nh, self.nkv, self.d = (
            a["hidden_size"],
            a["num_attention_heads"],
            a["num_key_value_heads"],
            a["head_dim"],
        )
        self.theta = float(a["rope_theta"])
        self.q_proj = nn.Linear(h, self.nh * self.d, bias=False)
        self.k_proj = nn.Linear(h, self.nkv * self.d, bias=False)
        self.v_proj = nn.Linear(h, self.nkv * self.d, bias=False)
        self.o_proj = nn.Linear(self.nh * self.d, h, bias=False)
        self.q_norm = RMSNorm(self.d, a["rms_norm_eps"])
        self.k_norm = RMSNorm(self.d, a["rms_norm_eps"])

    def keys_values(self, x: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Normed, rotated keys and values ``[B, T, kv heads, d]`` of ``x [B, T, H]``."""
        b, t, _ = x.shape
        k = rope(self.k_norm(self.k_proj(x).view(b, t, self.nkv, self.d)), pos, self.theta)
        return k, self.v_proj(x).view(b, t, self.nkv, self.d)

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, ctx: tuple[torch.Tensor, torch.Tensor], allowed: torch.Tensor
    ) -> torch.Tensor:
        """Block ``x [B, Q, H]`` attending to context keys/values ``ctx`` then to itself;
        ``allowed [B, Q, C + Q]`` says which (False: masked)."""
        b, q, _ = x.shape
        qs = rope(self.q_norm(self.q_proj(x).view(b, q, self.nh, self.d)), pos, self.theta)
        k, v = self.keys_values(x, pos)
        k, v = torch.cat([ctx[0], k], 1), torch.cat([ctx[1], v], 1)
        rep = self.nh // self.nkv
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        out = nn.functional.scaled_dot_product_attention(
            qs.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=allowed[:, None]
        )
        o: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(b, q, self.nh * self.d))
        return o


class Mlp(nn.Module):
    def __init__(self, h: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(h, inter, bias=False)
        self.up_proj = nn.Linear(h, inter, bias=False)
        self.down_proj = nn.Linear(inter, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class Layer(nn.Module):
    def __init__(self, a: dict[str, Any]):
        super().__init__()
        self.self_attn = Attention(a)
        self.mlp = Mlp(a["hidden_size"], a["intermediate_size"])
        self.input_layernorm = RMSNorm(a["hidden_size"], a["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(a["hidden_size"], a["rms_norm_eps"])

    def forward(
        self, x: torch.Tensor, pos: torch.Tensor, ctx: tuple[torch.Tensor, torch.Tensor], allowed: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), pos, ctx, allowed)
        out: torch.Tensor = x + self.mlp(self.post_attention_layernorm(x))
        return out


class DFlashDraft(nn.Module):
    """The drafter: ``arch`` holds the layers' shape, ``num_layers``, ``block_size``,
    ``target_layer_ids``, ``mask_token_id`` and ``num_target_layers``."""

    kind = "dflash"

    def __init__(self, arch: dict[str, Any]):
        super().__init__()
        self.arch = dict(arch)
        h, eps = int(arch["hidden_size"]), float(arch["rms_norm_eps"])
        self.hidden_size = h
        self.block_size = int(arch["block_size"])
        self.mask_token_id = int(arch["mask_token_id"])
        self.target_layer_ids = [int(i) for i in arch["target_layer_ids"]]
        self.fc = nn.Linear(len(self.target_layer_ids) * h, h, bias=False)
        self.hidden_norm = RMSNorm(h, eps)
        self.layers: list[Layer] = nn.ModuleList([Layer(self.arch) for _ in range(int(arch["num_layers"]))])  # type: ignore[assignment]  # a ModuleList of Layers
        self.norm = RMSNorm(h, eps)

    @property
    def aux_streams(self) -> list[int]:
        """The target layers whose *input* streams hold the features (transformers' hidden_states[k])."""
        return [i + 1 for i in self.target_layer_ids]

    def context_kv(self, features: torch.Tensor, pos: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's keys/values of context ``features [B, C, nH]`` (the concatenated streams) at ``pos [B, C]``."""
        c = self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))
        return [layer.self_attn.keys_values(c, pos) for layer in self.layers]

    def forward(
        self,
        embeddings: torch.Tensor,
        pos: torch.Tensor,
        ctx: list[tuple[torch.Tensor, torch.Tensor]],
        allowed: torch.Tensor,
    ) -> torch.Tensor:
        """Block ``embeddings [B, Q, H]`` at ``pos`` over ``ctx`` (:meth:`context_kv`) → normed ``[B, Q, H]``."""
        x = embeddings.to(self.fc.weight.dtype)
        for layer, kv in zip(self.layers, ctx):
            x = layer(x, pos, kv, allowed)
        out: torch.Tensor = self.norm(x)
        return out

    def engine_state_dict(self) -> dict[str, torch.Tensor]:
        """The tensors under vLLM's checkpoint names (bf16)."""
        return {k: v.detach().to(torch.bfloat16).contiguous() for k, v in self.state_dict().items()}

    def engine_config(self) -> dict[str, Any]:
        """config.json as vLLM reads it (a Qwen3 config plus DFlash's keys)."""
        a = self.arch
        shape = {k: a[k] for k in (*SHAPE_INTS, *SHAPE_FLOATS)}
        return {
            "architectures": [ARCHITECTURE],
            "model_type": "qwen3",
            **shape,
            "rope_parameters": {"rope_type": "default", "rope_theta": a["rope_theta"]},
            "num_hidden_layers": len(self.layers),
            "hidden_act": "silu",
            "attention_bias": False,
            "max_position_embeddings": int(a.get("max_position_embeddings", 8192)),
            "vocab_size": int(a["vocab_size"]),
            "tie_word_embeddings": False,
            "block_size": self.block_size,
            "num_target_layers": int(a["num_target_layers"]),
            "dflash_config": {"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids},
        }


def save_dflash(module: DFlashDraft, folder: str | Path, record: dict[str, Any] | None = None) -> Path:
    """Write ``folder``/config.json, model.safetensors and specstudy.json; returns the folder."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / CONFIG_FILE).write_text(json.dumps(module.engine_config(), indent=2) + "\n")
    save_file(module.engine_state_dict(), str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / RECORD_FILE).write_text(json.dumps({"kind": "dflash", **(record or {})}, indent=2, default=str) + "\n")
    return folder


def read_dflash_config(folder: str | Path) -> dict[str, Any]:
    """config.json of a DFlash folder; a ValueError naming the file unless it is one."""
    return read_folder_config(folder, ARCHITECTURE, "num_hidden_layers", "dflash", CONFIG_FILE, WEIGHTS_FILE)


def arch_of(cfg: dict[str, Any]) -> dict[str, Any]:
    """The module's ``arch`` from a folder's config.json."""
    from ..config.drafter_configs import dflash_fields

    block, ids, mask = dflash_fields(cfg)
    arch: dict[str, Any] = {k: int(cfg[k]) for k in SHAPE_INTS} | {k: float(cfg[k]) for k in SHAPE_FLOATS}
    arch.update(
        num_layers=int(cfg["num_hidden_layers"]),
        block_size=block,
        target_layer_ids=ids,
        mask_token_id=mask,
        num_target_layers=int(cfg["num_target_layers"]),
        vocab_size=int(cfg["vocab_size"]),
    )
    return arch


def check_for_target(cfg: dict[str, Any], target_config: Any, where: str) -> None:
    """Every mismatch between a DFlash config and its target, listed at once (a ValueError)."""
    from ..config.drafter_configs import dflash_fields

    block, ids, mask = dflash_fields(cfg)
    n, vocab = int(target_config.num_hidden_layers), int(target_config.vocab_size)
    problems = []
    if int(cfg.get("hidden_size", -1)) != int(target_config.hidden_size):
        problems.append(f"hidden_size {cfg.get('hidden_size')} is not the target's {target_config.hidden_size}")
    if cfg.get("num_target_layers") != n:
        problems.append(f"num_target_layers {cfg.get('num_target_layers')} is not the target's {n}")
    if not ids or not all(0 <= i < n - 1 for i in ids) or ids != sorted(set(ids)):
        problems.append(f"dflash_config.target_layer_ids {ids}: distinct, increasing, each in 0..{n - 2}")
    if not isinstance(mask, int) or not 0 <= mask < vocab:
        problems.append(f"dflash_config.mask_token_id {mask!r}: a token id in 0..{vocab - 1}")
    if not isinstance(block, int) or block < 2:
        problems.append(f"block_size {block!r}: an int >= 2 (one bonus slot and at least one mask slot)")
    if int(cfg.get("vocab_size", -1)) != vocab:
        problems.append(f"vocab_size {cfg.get('vocab_size')} is not the target's {vocab}")
    if problems:
        raise ValueError(f"{where}: " + "; ".join(problems))


def load_dflash(folder: str | Path, target_config: Any) -> DFlashDraft:
    """The drafter of a folder for a target; every tensor must be present and used."""
    from safetensors.torch import load_file

    cfg = read_dflash_config(folder)
    check_for_target(cfg, target_config, str(folder))
    module = DFlashDraft(arch_of(cfg))
    state = {k: v.float() for k, v in load_file(str(Path(folder) / WEIGHTS_FILE)).items()}
    missing, unexpected = module.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{folder}: DFlash weights missing {missing}, unexpected {unexpected}")
    return module.eval()


@torch.no_grad()
def block_logits(draft: DFlashDraft, target: Any, tokens: list[int], n: int, gamma: int) -> torch.Tensor:
    """The γ mask slots' logits ``[γ, V]`` after ``tokens[: n + 1]``, from the target's own features
    of positions 0 .. n − 1 read at ``draft``'s target layers (one target pass, one drafter pass)."""
    from .methods.heads import AuxCapture

    with AuxCapture(target, draft.aux_streams) as capture:
        target(input_ids=torch.tensor([tokens[:n]]))
        feats = capture.last
    assert feats is not None  # every hooked layer ran
    dtype = next(target.parameters()).dtype
    ctx = draft.context_kv(feats.to(dtype), torch.arange(n)[None])
    ids = torch.tensor([[tokens[n]] + [draft.mask_token_id] * gamma])
    allowed = torch.ones(1, gamma + 1, n + gamma + 1, dtype=torch.bool)
    out = draft(target.get_input_embeddings()(ids), torch.arange(n, n + gamma + 1)[None], ctx, allowed)
    logits: torch.Tensor = target.get_output_embeddings()(out[0, 1:].to(dtype))
    return logits


def check_export(module: DFlashDraft, folder: str | Path, target: Any, tokens: list[int] | None = None) -> None:
    """The folder, read back as vLLM reads it (its config's target layers, block and mask token, the
    bf16 tensors), drafts what the trained drafter drafts at several points of ``tokens``; a
    ValueError naming each mismatch otherwise.  What it catches: target layer ids off by one (the
    engines' aux-stream numbering), another mask token, a short block, tensors swapped."""
    import copy

    cfg = read_dflash_config(folder)
    check_for_target(cfg, target.config, str(folder))
    dtype = next(target.parameters()).dtype
    read = load_dflash(folder, target.config).to(dtype)
    trained = copy.deepcopy(module).to(torch.bfloat16).to(dtype)  # the export's rounding, nothing else
    seq = tokens or [(7 * i + 3) % int(target.config.vocab_size) for i in range(40)]
    gamma = module.block_size - 1
    problems = []
    if read.block_size != module.block_size:
        problems.append(f"block_size {read.block_size}, trained with {module.block_size}")
    for n in (4, len(seq) // 2, len(seq) - gamma - 2):
        want = block_logits(trained, target, seq, n, gamma)
        got = block_logits(read, target, seq, n, min(gamma, read.block_size - 1))
        if got.shape != want.shape or not torch.allclose(got, want, atol=1e-3, rtol=1e-3):
            diff = "shape" if got.shape != want.shape else f"max |Δlogit| {float((got - want).abs().max()):.3g}"
            problems.append(
                f"block after position {n}: drafts {got.argmax(-1).tolist()} vs trained {want.argmax(-1).tolist()} ({diff})"
            )
    if problems:
        raise ValueError(f"{folder}: the export does not draft as the trained drafter: " + "; ".join(problems))
