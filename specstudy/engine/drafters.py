"""Small trained drafters for a target that has no smaller sibling: architectures, files, training.

No package ships a small model with SmolLM2's tokenizer, so the kit distils its own drafters
from the target, on text the target itself generates from the kit's prompts:

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

Both are trained by distillation: the cross-entropy of the drafter's distribution against the
target's own next-token distribution (its top-``label_top_k`` probabilities, renormalised) at
the position the drafter predicts — the softmax restricted to the tokens labelled in the batch,
which keeps a CPU step cheap — plus an EAGLE-style regression of the drafter's vector onto the
target's own last hidden state there.  Features come from the generation passes themselves.  Files: ``<name>.safetensors`` (weights,
with the architecture in the safetensors metadata) and ``<name>.json`` (command, settings,
training log, held-out acceptance).
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from .kv import cache_arg

KINDS = ("heads", "layer_skip_adapter", "eagle")

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
        return self.blocks[head](x)


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
        return self.blocks(hidden)


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
        rope = getattr(config, "rope_parameters", None) or {}
        return cls(
            config.hidden_size,
            config.intermediate_size,
            config.num_attention_heads,
            getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))),
            float(getattr(config, "rms_norm_eps", 1e-5)),
        )

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
        return out.last_hidden_state


def build_drafter(config: dict[str, Any]) -> nn.Module:
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
    from ..config import REPO_ROOT

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


def save_drafter(module: nn.Module, path: str | Path, target: str, info: dict[str, Any] | None = None) -> Path:
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
) -> nn.Module:
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


# --------------------------------------------------------------------------------------------
# training data: the target's own generations


def target_parts(model: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module]:
    """(decoder stack, final norm, LM head) of a transformers causal LM."""
    base = getattr(model, model.base_model_prefix)
    return base, base.norm, model.get_output_embeddings()


@dataclass
class Features:
    """Per training position: the drafter's input hidden state and the target's label distribution.

    ``label_ids/label_probs [N, top_k]`` hold the target's next-token distribution at the position
    and ``final [N, H]`` its last hidden state there (the vector the LM head turns into that
    distribution; the same tensor as ``hidden`` for heads); ``seq [N]`` and ``pos [N]`` say where
    each row came from (heads pair row t with row t+k of the same sequence).
    """

    hidden: torch.Tensor
    final: torch.Tensor
    label_ids: torch.Tensor
    label_probs: torch.Tensor
    seq: torch.Tensor
    pos: torch.Tensor
    token: torch.Tensor  # [N] the token at the position (token-conditioned heads read it)


@torch.no_grad()
def collect_features(
    model: nn.Module,
    corpus: Sequence[tuple[list[int], int]],
    kind: str,
    exit_layer: int | None = None,
    label_top_k: int = 32,
) -> Features:
    """Run the target over each sequence once; keep positions from the last prompt token on
    (``eagle``: every position, since its drafter attends to the prompt's features too)."""
    base, norm, lm_head = target_parts(model)
    hs, fin, lid, lpr, seqs, poss, toks = [], [], [], [], [], [], []
    for s, (ids, plen) in enumerate(corpus):
        x = torch.tensor([ids])
        out = base(input_ids=x, output_hidden_states=kind == "layer_skip_adapter")
        last = out.last_hidden_state[0]
        probs = torch.softmax(lm_head(last).float(), dim=-1)
        top = torch.topk(probs, label_top_k, dim=-1)
        start = 0 if kind == "eagle" else max(plen - 1, 0)
        h = out.hidden_states[exit_layer][0] if kind == "layer_skip_adapter" else last
        hs.append(h[start:])
        fin.append(last[start:])
        lid.append(top.indices[start:])
        lpr.append(top.values[start:] / top.values[start:].sum(-1, keepdim=True))
        seqs.append(torch.full((len(ids) - start,), s))
        poss.append(torch.arange(start, len(ids)))
        toks.append(torch.tensor(ids[start:]))
    final = torch.cat(fin)
    hidden = final if kind == "heads" else torch.cat(hs)
    return Features(hidden, final, torch.cat(lid), torch.cat(lpr), torch.cat(seqs), torch.cat(poss), torch.cat(toks))


@torch.no_grad()
def generate_with_features(
    model: nn.Module,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    kind: str,
    exit_layer: int | None = None,
    label_top_k: int = 32,
    batch_size: int = 8,
    pad_id: int = 0,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[tuple[list[int], int]], Features]:
    """Greedy continuations of ``prompts`` by the target, and the distillation features read
    from the same decoding passes (no second forward over the text).

    Batched with left padding through transformers' ``generate`` (data preparation, not a
    measurement).  EOS does not stop generation, as in the study (``ignore_eos``).  Returns the
    corpus — (prompt + generation ids, prompt length) per prompt — and :class:`Features` for
    positions plen-1 .. plen+max_new_tokens-2 of each sequence (each generation step's input
    token, whose next-token distribution the step computed).  ``eagle``: features of every
    position, prompt included, from one target pass over each finished sequence
    (:func:`collect_features`), since its drafter attends to the prompt's features too.
    """
    import copy

    if kind == "eagle":
        corpus, _ = generate_with_features(
            model, prompts, max_new_tokens, "heads", None, label_top_k, batch_size, pad_id, progress
        )
        return corpus, collect_features(model, corpus, "eagle", label_top_k=label_top_k)

    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None
    config.update(
        max_new_tokens=max_new_tokens,
        min_new_tokens=0,
        do_sample=False,
        pad_token_id=pad_id,
        temperature=None,
        top_p=None,
        top_k=None,
        return_dict_in_generate=True,
        output_hidden_states=True,
        output_logits=True,
    )
    layer = -1 if kind == "heads" else exit_layer
    corpus: list[tuple[list[int], int]] = []
    hs, fin, lid, lpr, seqs, poss, toks = [], [], [], [], [], [], []
    for i in range(0, len(prompts), batch_size):
        chunk = [list(p) for p in prompts[i : i + batch_size]]
        w = max(len(p) for p in chunk)
        ids = torch.tensor([[pad_id] * (w - len(p)) + p for p in chunk])
        att = torch.tensor([[0] * (w - len(p)) + [1] * len(p) for p in chunk])
        out = model.generate(input_ids=ids, attention_mask=att, generation_config=config)
        steps = len(out.logits)
        final = torch.stack([out.hidden_states[j][-1][:, -1] for j in range(steps)], dim=1)  # [B, T, H]
        hidden = final if layer == -1 else torch.stack([out.hidden_states[j][layer][:, -1] for j in range(steps)], 1)
        probs = torch.softmax(torch.stack(out.logits, dim=1).float(), dim=-1)  # [B, T, V]
        top = torch.topk(probs, label_top_k, dim=-1)
        for b, p in enumerate(chunk):
            s_id = len(corpus)
            corpus.append((p + out.sequences[b, w:].tolist(), len(p)))
            toks.append(torch.tensor(corpus[-1][0][len(p) - 1 : len(p) - 1 + steps]))
            hs.append(hidden[b])
            fin.append(final[b])
            lid.append(top.indices[b])
            lpr.append(top.values[b] / top.values[b].sum(-1, keepdim=True))
            seqs.append(torch.full((steps,), s_id))
            poss.append(torch.arange(len(p) - 1, len(p) - 1 + steps))
        if progress:
            progress(f"generated {len(corpus)}/{len(prompts)} continuations")
    f_final = torch.cat(fin)
    features = Features(
        f_final if kind == "heads" else torch.cat(hs),
        f_final,
        torch.cat(lid),
        torch.cat(lpr),
        torch.cat(seqs),
        torch.cat(poss),
        torch.cat(toks),
    )
    return corpus, features


def head_pairs(features: Features, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices (src, dst): dst is the position k after src in the same sequence."""
    n = len(features.seq)
    src = torch.arange(n - k)
    dst = src + k
    ok = (features.seq[src] == features.seq[dst]) & (features.pos[dst] == features.pos[src] + k)
    return src[ok], dst[ok]


def distill_loss(logits: torch.Tensor, label_ids: torch.Tensor, label_probs: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the drafter against the target's (top-k, renormalised) distribution."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(label_probs * logp.gather(-1, label_ids)).sum(-1).mean()


def candidate_distill_loss(
    vectors: torch.Tensor, lm_head: nn.Module, label_ids: torch.Tensor, label_probs: torch.Tensor
) -> torch.Tensor:
    """:func:`distill_loss` with the softmax restricted to the tokens labelled anywhere in the batch.

    The full LM head (49k × 576 for SmolLM2) would make every CPU step cost several GFLOP per
    head; the batch's labelled tokens (a few thousand) carry nearly all of the target's mass.
    """
    cand, inverse = torch.unique(label_ids, return_inverse=True)
    logits = vectors @ lm_head.weight[cand].T
    if getattr(lm_head, "bias", None) is not None:
        logits = logits + lm_head.bias[cand]
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(label_probs * logp.gather(-1, inverse)).sum(-1).mean()


def regression_loss(vectors: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error to the target's own hidden state, relative to its mean square (EAGLE-style
    feature regression: keeps the drafter's vector where the LM head reads the right token)."""
    return ((vectors - target) ** 2).mean() / (target**2).mean().clamp(min=1e-12)


# --------------------------------------------------------------------------------------------
# training


@dataclass
class TrainSettings:
    kind: str = "heads"
    num_heads: int = 4
    num_layers: int = 1
    token_conditioned: bool = False
    exit_layer: int = 8
    steps: int = 600
    batch_tokens: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.0
    label_top_k: int = 32
    regression_weight: float = 1.0
    seed: int = 0
    eval_fraction: float = 0.1

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r}: allowed {KINDS}")
        for name in ("num_heads", "num_layers", "exit_layer", "steps", "batch_tokens", "label_top_k"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 1")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction={self.eval_fraction!r}: must lie in [0, 1)")


@dataclass
class TrainResult:
    module: nn.Module
    log: list[dict[str, float]] = field(default_factory=list)
    eval: dict[str, Any] = field(default_factory=dict)


def _split_sequences(features: Features, eval_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    seqs = sorted(set(features.seq.tolist()))
    rng = random.Random(seed)
    rng.shuffle(seqs)
    n_eval = int(round(len(seqs) * eval_fraction))
    held = torch.tensor(sorted(seqs[:n_eval]), dtype=torch.long)
    is_eval = torch.isin(features.seq, held) if n_eval else torch.zeros(len(features.seq), dtype=torch.bool)
    return ~is_eval, is_eval


def _pairs_by_head(
    features: Features, settings: TrainSettings, rows: torch.Tensor
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For each head k: (src, dst) row pairs with both ends in ``rows`` (bool over rows)."""
    if settings.kind == "layer_skip_adapter":
        idx = torch.nonzero(rows).squeeze(1)
        return [(idx, idx)]
    out = []
    for k in range(1, settings.num_heads + 1):
        src, dst = head_pairs(features, k)
        keep = rows[src]
        out.append((src[keep], dst[keep]))
    return out


def _drafter_vectors(
    module: nn.Module, model: nn.Module, features: Features, src: torch.Tensor, dst: torch.Tensor, head: int
) -> torch.Tensor:
    """What the drafter hands to the LM head for rows ``src`` predicting the label at ``dst``
    (after the final norm for the adapter).  Token-conditioned heads read the token at ``dst``
    (the one right before the predicted token)."""
    _, norm, _ = target_parts(model)
    if isinstance(module, MedusaHeads):
        prev = model.get_input_embeddings()(features.token[dst]) if module.token_conditioned else None
        return module.vectors(head, features.hidden[src], prev)
    return norm(module(features.hidden[src]))


@torch.no_grad()
def evaluate(
    module: nn.Module,
    model: nn.Module,
    features: Features,
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
    chunk: int = 512,
) -> dict[str, Any]:
    """Held-out loss and top-1 agreement with the target's argmax, per head (or for the adapter)."""
    res = {"loss": [], "top1": [], "n": []}
    for k, (src, dst) in enumerate(pairs):
        tot_loss, tot_hit, n = 0.0, 0, len(src)
        for i in range(0, n, chunk):
            s, d = src[i : i + chunk], dst[i : i + chunk]
            logits = target_parts(model)[2](_drafter_vectors(module, model, features, s, d, k))
            tot_loss += float(distill_loss(logits, features.label_ids[d], features.label_probs[d])) * len(s)
            tot_hit += int((logits.argmax(-1) == features.label_ids[d, 0]).sum())
        res["loss"].append(tot_loss / n if n else math.nan)
        res["top1"].append(tot_hit / n if n else math.nan)
        res["n"].append(n)
    return res


def train_drafter(
    model: nn.Module,
    features: Features,
    settings: TrainSettings,
    progress: Callable[[str], None] | None = None,
    prompt_lengths: Sequence[int] | None = None,
) -> TrainResult:
    """Distil a drafter on ``features`` (target frozen); log train loss every ~5 % of the steps.

    ``prompt_lengths[s]`` (eagle): sequence s's prompt length, so the held-out top-1 is
    reported on generated positions, as for the other kinds.
    """
    torch.manual_seed(settings.seed)
    for p in model.parameters():
        p.requires_grad_(False)
    if settings.kind == "eagle":
        return _train_eagle(model, features, settings, progress, prompt_lengths)
    hidden_size = features.hidden.shape[-1]
    if settings.kind == "heads":
        module: nn.Module = MedusaHeads(
            hidden_size, settings.num_heads, settings.num_layers, settings.token_conditioned
        )
    else:
        module = LayerSkipAdapter(hidden_size, settings.exit_layer, settings.num_layers)
    train_rows, eval_rows = _split_sequences(features, settings.eval_fraction, settings.seed)
    train_pairs = _pairs_by_head(features, settings, train_rows)
    eval_pairs = _pairs_by_head(features, settings, eval_rows)
    if any(len(src) == 0 for src, _ in train_pairs):
        raise ValueError("no training pairs for some head: generate longer continuations or more prompts")
    lm_head = target_parts(model)[2]

    def step_losses(gen: torch.Generator) -> list[torch.Tensor]:
        losses = []
        for k, (src, dst) in enumerate(train_pairs):
            pick = torch.randint(len(src), (settings.batch_tokens,), generator=gen)
            s, d = src[pick], dst[pick]
            vec = _drafter_vectors(module, model, features, s, d, k)
            ce = candidate_distill_loss(vec, lm_head, features.label_ids[d], features.label_probs[d])
            losses.append(ce + settings.regression_weight * regression_loss(vec, features.final[d]))
        return losses

    log = _optimise(module, settings, step_losses, progress)
    ev = evaluate(module, model, features, eval_pairs) if bool(eval_rows.any()) else {}
    return TrainResult(module=module, log=log, eval=ev)


def _optimise(
    module: nn.Module,
    settings: TrainSettings,
    step_losses: Callable[[torch.Generator], list[torch.Tensor]],
    progress: Callable[[str], None] | None,
) -> list[dict[str, Any]]:
    """AdamW with 20 warm-up steps and a cosine decay; each step minimises the sum of
    ``step_losses(gen)`` (one per head, or one); logs their means every ~5 % of the steps."""
    opt = torch.optim.AdamW(module.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, settings.steps) / settings.steps))
    )
    gen = torch.Generator().manual_seed(settings.seed)
    log: list[dict[str, Any]] = []
    every = max(1, settings.steps // 20)
    t0 = time.perf_counter()
    module.train()
    running: list[list[float]] = []
    for step in range(settings.steps):
        losses = step_losses(gen)
        loss = torch.stack(losses).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        running.append([float(x.detach()) for x in losses])
        if (step + 1) % every == 0 or step == 0 or step + 1 == settings.steps:
            mean = [sum(r[k] for r in running) / len(running) for k in range(len(losses))]
            entry = {
                "step": step + 1,
                "loss": sum(mean),
                "loss_per_head": mean,
                "lr": sched.get_last_lr()[0],
                "elapsed_s": round(time.perf_counter() - t0, 2),
            }
            log.append(entry)
            running = []
            if progress:
                progress(f"step {step + 1}/{settings.steps} loss {entry['loss']:.4f}")
    module.eval()
    return log


def _sequence_rows(features: Features, rows: torch.Tensor) -> dict[int, torch.Tensor]:
    """Row indices of each sequence with rows in ``rows``, in position order."""
    out: dict[int, torch.Tensor] = {}
    for s in sorted(set(features.seq[rows].tolist())):
        idx = torch.nonzero((features.seq == s) & rows).squeeze(1)
        out[s] = idx[torch.argsort(features.pos[idx])]
    return out


def eagle_sequence_loss(
    module: EagleDraft, model: nn.Module, features: Features, idx: torch.Tensor, regression_weight: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced pass over one sequence (rows ``idx``): pairs (f_j, token_{j+1}) predict
    f_{j+1} and the target's distribution there.  Returns (loss, predicted vectors [L-1, H])."""
    emb = model.get_input_embeddings()
    lm_head = target_parts(model)[2]
    f = features.final[idx]
    pred = module(emb(features.token[idx[1:]])[None], f[:-1][None], position_ids=torch.arange(len(idx) - 1)[None])[0]
    nxt = idx[1:]
    ce = candidate_distill_loss(pred, lm_head, features.label_ids[nxt], features.label_probs[nxt])
    return ce + regression_weight * regression_loss(pred, f[1:]), pred


def _train_eagle(
    model: nn.Module,
    features: Features,
    settings: TrainSettings,
    progress: Callable[[str], None] | None,
    prompt_lengths: Sequence[int] | None,
) -> TrainResult:
    """EAGLE-style training: whole sequences, teacher-forced with the target's own features;
    each step takes random sequences until ``batch_tokens`` positions, loss weighted by length."""
    module = EagleDraft.for_target(model.config).to(dtype=features.final.dtype)
    train_rows, eval_rows = _split_sequences(features, settings.eval_fraction, settings.seed)
    train_seqs = [v for v in _sequence_rows(features, train_rows).values() if len(v) >= 2]
    if not train_seqs:
        raise ValueError("no training sequence of two or more positions")

    def step_losses(gen: torch.Generator) -> list[torch.Tensor]:
        picked, n = [], 0
        while n < settings.batch_tokens:
            idx = train_seqs[int(torch.randint(len(train_seqs), (1,), generator=gen))]
            picked.append(idx)
            n += len(idx) - 1
        return [
            sum(
                eagle_sequence_loss(module, model, features, idx, settings.regression_weight)[0] * (len(idx) - 1)
                for idx in picked
            )
            / n
        ]

    log = _optimise(module, settings, step_losses, progress)
    ev: dict[str, Any] = {}
    if bool(eval_rows.any()):
        hits = total = 0
        loss_sum = 0.0
        with torch.no_grad():
            for s, idx in _sequence_rows(features, eval_rows).items():
                if len(idx) < 2:
                    continue
                _, pred = eagle_sequence_loss(module, model, features, idx, settings.regression_weight)
                start = max(int(prompt_lengths[s]) - 2, 0) if prompt_lengths is not None else 0
                logits = target_parts(model)[2](pred[start:])
                nxt = idx[1:][start:]
                hits += int((logits.argmax(-1) == features.label_ids[nxt, 0]).sum())
                loss_sum += float(distill_loss(logits, features.label_ids[nxt], features.label_probs[nxt])) * len(nxt)
                total += len(nxt)
        ev = {
            "loss": [loss_sum / total if total else math.nan],
            "top1": [hits / total if total else math.nan],
            "n": [total],
            "positions": "generated" if prompt_lengths is not None else "all",
            "mode": "teacher-forced (the target's own features as input): the first draft of a step",
        }
    return TrainResult(module=module, log=log, eval=ev)


def settings_dict(settings: TrainSettings) -> dict[str, Any]:
    return asdict(settings)
