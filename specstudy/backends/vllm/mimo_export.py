"""A Llama-style target plus the kit's MTP layer as one MiMo model, which vLLM runs with ``method: mtp``.

vLLM's ``speculative.py`` turns a target whose ``architectures[0]`` is ``MiMoForCausalLM`` into
its own MTP drafter (``MiMoMTPModel``, ``mimo_mtp.py``): the same folder, read twice.
``MiMoForCausalLM`` is Qwen2 (``mimo.py``), and a Qwen2 layer is a Llama layer plus q/k/v biases,
so a Llama target with zero biases computes the same function: the tensor names are Llama's
(``model.layers.{i}...``, ``model.embed_tokens``, ``model.norm``), plus
``model.layers.{i}.self_attn.{q,k,v}_proj.bias`` (zeros), ``lm_head.weight`` written out even for a
target with tied embeddings (``MiMoMTP`` loads its head from ``lm_head`` and ties nothing) and the
MTP layer's tensors as :mod:`specstudy.engine.mtp_drafter` stores them.  The config is Qwen2's
(``model_type: qwen2``: transformers reads it without remote code) with the target's rope theta and
RMS epsilon, ``tie_word_embeddings: false``, ``num_nextn_predict_layers: 1``.

:func:`check_mimo` reads the folder back as an engine would (the base model through transformers'
Qwen2, the MTP layer from its names) and compares it with the target and the trained layer: a
slip in the export (layers out of order, the MTP input's halves swapped, a norm confused) reaches
every engine alike, and only this sees it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from ...engine.mtp_drafter import CONFIG_FILE, WEIGHTS_FILE, MtpDraft, load_mtp, mtp_from_state

ARCHITECTURE = "MiMoForCausalLM"


def mimo_config(target_config: Any) -> dict[str, Any]:
    """The MiMo (Qwen2) config.json of a Llama-style target with one MTP layer."""
    from ...engine.drafters import layer_shape

    a, c = layer_shape(target_config), target_config
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen2",
        "hidden_size": a["hidden_size"],
        "intermediate_size": a["intermediate_size"],
        "num_attention_heads": a["num_attention_heads"],
        "num_key_value_heads": a["num_key_value_heads"],
        "head_dim": a["head_dim"],
        "num_hidden_layers": int(c.num_hidden_layers),
        "hidden_act": "silu",
        "rms_norm_eps": a["rms_norm_eps"],
        "rope_theta": a["rope_theta"],
        "rope_parameters": {"rope_type": "default", "rope_theta": a["rope_theta"]},
        "rope_scaling": None,
        "max_position_embeddings": int(c.max_position_embeddings),
        "max_window_layers": int(c.num_hidden_layers),
        "use_sliding_window": False,
        "sliding_window": None,
        "vocab_size": int(c.vocab_size),
        "tie_word_embeddings": False,
        "bos_token_id": c.bos_token_id,
        "eos_token_id": c.eos_token_id,
        "torch_dtype": "float32",
        "num_nextn_predict_layers": 1,
    }


def mimo_state(target_state: dict[str, torch.Tensor], mtp_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Target tensors (transformers Llama names) + ``lm_head`` + the MTP layer's, and zero q/k/v
    biases for every layer, the MTP layer's included (vLLM's Qwen2 layers have them and would
    otherwise keep whatever memory they were given)."""
    out = {k: v.contiguous() for k, v in target_state.items() if not k.endswith("rotary_emb.inv_freq")}
    if "lm_head.weight" not in out:
        out["lm_head.weight"] = out["model.embed_tokens.weight"].clone()
    out |= dict(mtp_state)
    for k, v in list(out.items()):
        for p in ("q_proj", "k_proj", "v_proj"):
            if k.endswith(f"self_attn.{p}.weight"):
                out[k.replace(".weight", ".bias")] = torch.zeros(v.shape[0], dtype=v.dtype)
    return out


def write_mimo(target_dir: str | Path, mtp_folder: str | Path, out: str | Path) -> Path:
    """Write the MiMo folder (config, weights, the target's tokenizer files) of target + MTP layer."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    target_dir, out = Path(target_dir), Path(out)
    target_config = AutoConfig.from_pretrained(target_dir)
    load_mtp(mtp_folder, target_config)  # refuses a folder that is not the target's MTP layer
    state = {}
    for f in sorted(target_dir.glob("*.safetensors")):
        state.update(load_file(str(f)))
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in target_dir.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("generation_config.json", "chat_template.jinja"):
            shutil.copy2(f, tmp / f.name)
    (tmp / CONFIG_FILE).write_text(json.dumps(mimo_config(target_config), indent=2) + "\n")
    mimo = mimo_state(state, load_file(str(Path(mtp_folder) / WEIGHTS_FILE)))
    save_file(mimo, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def mimo_dir(target_dir: str | Path, mtp_folder: str | Path) -> Path:
    """The MiMo folder of (target, MTP layer) in the kit's cache, written once per pair of files."""
    from ...data.fetch import cache_dir, sha256_file

    digest = hashlib.sha256()
    for f in sorted(Path(target_dir).glob("*.safetensors")) + [Path(mtp_folder) / WEIGHTS_FILE]:
        digest.update(sha256_file(f).encode())
    out = cache_dir() / "mimo" / digest.hexdigest()[:24]
    if not (out / WEIGHTS_FILE).is_file():
        write_mimo(target_dir, mtp_folder, out)
    return out


@torch.no_grad()
def check_mimo(folder: str | Path, target: Any, trained: MtpDraft, seed: int = 0) -> None:
    """Read a MiMo folder back and compare it with ``target`` and the ``trained`` MTP layer.

    The base model, loaded by transformers' Qwen2, must give the target's greedy ids and logits on
    random prompts; the MTP layer, read from its names, the trained layer's output on random
    inputs (bf16-sized tolerance).  Raises ValueError naming every difference.
    """
    from safetensors.torch import load_file
    from transformers import Qwen2ForCausalLM

    folder, problems = Path(folder), []
    gen = torch.Generator().manual_seed(seed)
    dtype = next(target.parameters()).dtype
    base = Qwen2ForCausalLM.from_pretrained(folder, dtype=dtype)
    base.eval()  # type: ignore[no-untyped-call]  # untyped in transformers
    ids = torch.randint(0, int(target.config.vocab_size), (2, 24), generator=gen)
    want, got = target(input_ids=ids).logits, base(input_ids=ids).logits
    if not torch.equal(want.argmax(-1), got.argmax(-1)):
        problems.append("the base model's greedy ids differ from the target's")
    elif not torch.allclose(want, got, rtol=1e-4, atol=1e-4 * float(want.abs().max())):
        problems.append(f"the base model's logits differ from the target's by {float((want - got).abs().max()):.3g}")
    cfg = json.loads((folder / CONFIG_FILE).read_text())
    keys = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    arch = {k: int(cfg[k]) for k in keys} | {k: float(cfg[k]) for k in ("rope_theta", "rms_norm_eps")}
    if int(cfg.get("num_nextn_predict_layers", 0)) != 1 or cfg.get("architectures") != [ARCHITECTURE]:
        problems.append(
            f"config.json: architectures {cfg.get('architectures')}, num_nextn_predict_layers "
            f"{cfg.get('num_nextn_predict_layers')}; need [{ARCHITECTURE!r}] and 1"
        )
    try:
        back = mtp_from_state(arch, load_file(str(folder / WEIGHTS_FILE)), str(folder))
    except ValueError as e:
        problems.append(str(e))
    else:
        problems += _layer_differences(trained, back, gen)
    if problems:
        raise ValueError(f"{folder}: " + "; ".join(problems))


def _layer_differences(a: MtpDraft, b: MtpDraft, gen: torch.Generator) -> list[str]:
    """The two layers on the same random (embedding, hidden) inputs: output close (bf16 rounding)."""
    h = a.hidden_size
    e, f = torch.randn(1, 16, h, generator=gen), 4 * torch.randn(1, 16, h, generator=gen)
    pos = torch.arange(16)[None]
    a, b = copy.deepcopy(a).float(), b.float()  # the trained layer stays as it is
    ya, yb = a(e, f, position_ids=pos), b(e, f, position_ids=pos)
    err = float((ya - yb).abs().max())
    return (
        []
        if err <= 0.05 * float(ya.abs().max())
        else [f"the MTP layer read back differs from the trained one by {err:.3g}"]
    )


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("target_dir", help="the target's Hugging Face folder (e.g. `specstudy models path smollm2-135m`)")
    p.add_argument("mtp_folder", help="an MTP folder from `specstudy train-drafter --kind mtp`")
    p.add_argument("out")
    a = p.parse_args(argv)
    print(write_mimo(a.target_dir, a.mtp_folder, a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
