"""The kit's EAGLE-3 head as the GGUF llama.cpp's ``draft-eagle3`` reads (architecture ``eagle3``).

Names are llama.cpp's (``src/models/eagle3.cpp``'s loader and ``llama-arch.cpp``'s tables, the
keys checked against the strings of the pinned xllamacpp build): metadata ``eagle3.target_layers``
(three ids, the layers whose *input* is captured: the kit's ``aux_layers`` as they are, the same
meaning as vLLM's aux ids), ``eagle3.target_hidden_size``, ``eagle3.norm_before_residual``
(false: the kit's midlayer adds the raw feature), the Llama hyper-parameters under ``eagle3.``,
and the target's tokenizer (the draft shares it).  Tensors: ``fc.weight``, ``blk.0.attn_norm``
(the embedding's norm), ``blk.0.attn_norm_2`` (the feature's norm), the attention and MLP weights
under llama.cpp's Llama names, ``output_norm``, ``output`` (the draft LM head) and ``d2t``.

Two conventions differ from the safetensors checkpoint vLLM reads, and each would be a silent
mistake if copied: llama.cpp's ``d2t`` is the *target id* of every draft id (it scatters the draft
logits with it), not the offset the checkpoint stores; and q/k rows are permuted from the
rotate-half layout to llama.cpp's interleaved rotary layout (``llama_model_rope_type`` gives
``eagle3`` LLAMA_ROPE_TYPE_NORM, as for Llama).  The token embedding is left out: the loader then
uses the target's.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ARCH = "eagle3"

#: the kit's checkpoint names (engine/eagle3.py's engine_state_dict) -> llama.cpp's
TENSOR_NAMES = {
    "fc.weight": "fc.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "midlayer.input_layernorm.weight": "blk.0.attn_norm.weight",
    "midlayer.hidden_norm.weight": "blk.0.attn_norm_2.weight",
    "midlayer.self_attn.q_proj.weight": "blk.0.attn_q.weight",
    "midlayer.self_attn.k_proj.weight": "blk.0.attn_k.weight",
    "midlayer.self_attn.v_proj.weight": "blk.0.attn_v.weight",
    "midlayer.self_attn.o_proj.weight": "blk.0.attn_output.weight",
    "midlayer.post_attention_layernorm.weight": "blk.0.ffn_norm.weight",
    "midlayer.mlp.gate_proj.weight": "blk.0.ffn_gate.weight",
    "midlayer.mlp.up_proj.weight": "blk.0.ffn_up.weight",
    "midlayer.mlp.down_proj.weight": "blk.0.ffn_down.weight",
}


def interleave_rotary(w: np.ndarray, n_head: int) -> np.ndarray:
    """Rows of a q or k projection from rotate-half order (each head's first half pairs with
    its second) to interleaved pairs (rows 2i and 2i+1), llama.cpp's rotary layout for Llama."""
    half = w.shape[0] // n_head // 2
    return w.reshape(n_head, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(state: dict[str, Any], cfg: dict[str, Any]) -> dict[str, np.ndarray]:
    """The checkpoint's tensors under llama.cpp's names (f32; ``d2t`` as absolute target ids, i64)."""
    out = {}
    for name, gname in TENSOR_NAMES.items():
        w = state[name].float().numpy()
        if name.endswith("q_proj.weight"):
            w = interleave_rotary(w, int(cfg["num_attention_heads"]))
        elif name.endswith("k_proj.weight"):
            w = interleave_rotary(w, int(cfg["num_key_value_heads"]))
        out[gname] = np.ascontiguousarray(w, dtype=np.float32)
    d2t = state["d2t"].long().numpy()
    out["d2t"] = (np.arange(len(d2t), dtype=np.int64) + d2t).astype(np.int64)
    return out


def copy_tokenizer(writer: Any, target_gguf: str | Path) -> int:
    """Every ``tokenizer.*`` key of the target's GGUF, with its type; returns how many."""
    from gguf import GGUFReader, GGUFValueType

    n = 0
    for field in GGUFReader(str(target_gguf)).fields.values():
        if not field.name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        value = field.contents()
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, vtype, sub_type=sub)
        n += 1
    return n


def write_eagle3_gguf(folder: str | Path, target_gguf: str | Path, out: str | Path, aux_layers: Sequence[int]) -> Path:
    """Write ``out`` from an EAGLE-3 folder (config.json + model.safetensors) for ``target_gguf``."""
    from gguf import GGUFValueType, GGUFWriter
    from safetensors.torch import load_file

    cfg = json.loads((Path(folder) / "config.json").read_text())
    state = load_file(str(Path(folder) / "model.safetensors"))
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    w = GGUFWriter(str(out), ARCH)
    w.add_name("specstudy EAGLE-3 head")
    for key, value in (
        ("context_length", int(cfg.get("max_position_embeddings", 8192))),
        ("embedding_length", int(cfg["hidden_size"])),
        ("block_count", 1),
        ("feed_forward_length", int(cfg["intermediate_size"])),
        ("attention.head_count", int(cfg["num_attention_heads"])),
        ("attention.head_count_kv", int(cfg["num_key_value_heads"])),
        ("attention.key_length", head_dim),
        ("attention.value_length", head_dim),
        ("rope.dimension_count", head_dim),
        ("vocab_size", int(cfg["vocab_size"])),
        ("target_hidden_size", int(cfg.get("target_hidden_size", cfg["hidden_size"]))),
    ):
        w.add_uint32(f"{ARCH}.{key}", value)
    w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", float(cfg["rms_norm_eps"]))
    w.add_float32(f"{ARCH}.rope.freq_base", float(cfg.get("rope_theta", 10000.0)))
    w.add_bool(f"{ARCH}.norm_before_residual", False)
    w.add_key_value(f"{ARCH}.target_layers", [int(k) for k in aux_layers], GGUFValueType.ARRAY, GGUFValueType.INT32)
    copy_tokenizer(w, target_gguf)
    for name, t in gguf_tensors(state, cfg).items():
        w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="an EAGLE-3 folder from `specstudy train-drafter --kind eagle3`")
    p.add_argument("target_gguf", help="the target's GGUF (its tokenizer is copied)")
    p.add_argument("out", help="the draft GGUF to write")
    a = p.parse_args(argv)
    record = json.loads((Path(a.folder) / "specstudy.json").read_text())
    print(write_eagle3_gguf(a.folder, a.target_gguf, a.out, record["aux_layers"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
