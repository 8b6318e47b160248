"""Random-weight stand-ins shaped like a hub model, placed in a Hugging Face cache under its own id.

A GPU profile names hub ids (``meta-llama/Llama-2-70b-chat-hf``); a rehearsal on a CPU runs the same
profile against a cache holding, under each id, a model of the same architecture class, vocabulary,
context and rope settings with fewer layers and a smaller width (:func:`scaled_config` says what it
scaled).  Nothing here is a measurement: the weights are random.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

#: the config keys a stand-in keeps exactly (what engines check and tensor parallelism divides)
KEPT = (
    "architectures",
    "model_type",
    "vocab_size",
    "max_position_embeddings",
    "rope_theta",
    "rope_scaling",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "tie_word_embeddings",
    "torch_dtype",
)
#: a snapshot name for stand-ins (the hub's commit hashes are 40 hex digits)
SNAPSHOT = "0" * 40


#: how a stand-in is scaled (:func:`scaled_config`'s defaults); a rehearsal's cache records it and is
#: rebuilt when it differs
RECIPE = {"layers": 8, "head_dim": 32, "max_heads": 8}


def scaled_config(
    cfg: dict[str, Any],
    layers: int = RECIPE["layers"],
    head_dim: int = RECIPE["head_dim"],
    max_heads: int = RECIPE["max_heads"],
) -> tuple[dict[str, Any], list[str]]:
    """``cfg`` with fewer layers, at most ``max_heads`` heads of ``head_dim`` (the GQA ratio kept: MHA
    stays MHA, 64/8 becomes 8/1), hence a smaller width; and what was scaled.  8 layers, not fewer:
    vLLM's EAGLE-3 takes its aux hidden states from layers (2, n // 2, n - 3), which coincide below
    7 layers (6 gave (2, 3, 3): two states where the head's fc wants three, and the engine died).

    Vocabulary, context, rope and architecture stay exact.  A rehearsal runs tensor parallelism at 1,
    so the head counts it divides are checked on the real config (:mod:`specstudy.config.model_configs`).
    """
    out = {k: cfg[k] for k in KEPT if k in cfg}
    n = int(cfg.get("num_attention_heads", 4))
    kv = int(cfg.get("num_key_value_heads") or n)
    heads = min(n, max_heads)
    scaled = {
        "num_hidden_layers": min(layers, int(cfg.get("num_hidden_layers", layers))),
        "num_attention_heads": heads,
        "num_key_value_heads": max(1, round(kv * heads / n)),
        "hidden_size": heads * head_dim,
        "intermediate_size": 2 * heads * head_dim,
        "head_dim": head_dim,
    }
    before = {**cfg, "num_key_value_heads": kv}
    notes = [f"{k}: {before.get(k)} -> {v}" for k, v in scaled.items() if before.get(k) != v]
    full = {**cfg, **out, **scaled}
    if full.pop("quantization_config", None) is not None:  # random weights are not quantized
        notes.append(f"quantization_config ({cfg['quantization_config'].get('quant_method')}) dropped")
    return full, notes


def standin_tokenizer(vocab_size: int, model_max_length: int) -> Any:
    """A byte-level tokenizer with exactly ``vocab_size`` ids (256 bytes, then fillers): any text encodes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(alphabet))}
    vocab.update({f"<x{i}>": i for i in range(len(vocab), vocab_size)})
    if len(vocab) != vocab_size:
        raise ValueError(f"vocab_size={vocab_size}: a stand-in tokenizer needs at least {len(vocab)} ids")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>", model_max_length=model_max_length
    )


#: the chat template a stand-in's tokenizer gets when the real tokenizer config is not here
GENERIC_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' + m['content'] + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def write_standin(
    cfg: dict[str, Any], folder: Path, seed: int = 0, chat_template: str | None = GENERIC_CHAT_TEMPLATE
) -> Path:
    """A random-weight model of config ``cfg`` and its stand-in tokenizer (with ``chat_template``), saved to ``folder``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    fields = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "transformers_version")}
    config = AutoConfig.for_model(cfg["model_type"], **fields)
    config.architectures = cfg.get("architectures")
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok = standin_tokenizer(int(cfg["vocab_size"]), int(cfg.get("max_position_embeddings", 2048)))
    tok.chat_template = chat_template
    tok.save_pretrained(folder)
    return folder


def place_in_hub_cache(folder: Path, repo: str, cache: Path) -> Path:
    """Copy ``folder``'s files into ``cache`` as the hub's layout for ``repo`` (what offline loads read)."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / SNAPSHOT
    snap.mkdir(parents=True, exist_ok=True)
    for f in folder.iterdir():
        if f.is_file():
            shutil.copy2(f, snap / f.name)
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / "main").write_text(SNAPSHOT)
    return snap


def read_config(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "config.json").read_text()))
