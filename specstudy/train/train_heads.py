"""Training of the position-wise drafters: Medusa/Hydra-style heads and the layer-skip adapter.

Both map one training position's hidden state to a vector the target's LM head reads (head k:
k tokens further ahead; the adapter: the hidden state after ``exit_layer`` layers, for the next
token), so they share the pairs, the loss and the evaluation here.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from ..engine.drafters import LayerSkipAdapter, MedusaHeads
from .data import Features, target_parts
from .loop import TrainResult, TrainSettings, optimise, split_sequences
from .losses import candidate_distill_loss, distill_loss, regression_loss


def head_pairs(features: Features, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row indices (src, dst): dst is the position k after src in the same sequence."""
    n = len(features.seq)
    src = torch.arange(n - k)
    dst = src + k
    ok = (features.seq[src] == features.seq[dst]) & (features.pos[dst] == features.pos[src] + k)
    return src[ok], dst[ok]


def pairs_by_head(
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


def drafter_vectors(
    module: nn.Module, model: PreTrainedModel, features: Features, src: torch.Tensor, dst: torch.Tensor, head: int
) -> torch.Tensor:
    """What the drafter hands to the LM head for rows ``src`` predicting the label at ``dst``
    (after the final norm for the adapter).  Token-conditioned heads read the token at ``dst``
    (the one right before the predicted token)."""
    _, norm, _ = target_parts(model)
    if isinstance(module, MedusaHeads):
        prev = model.get_input_embeddings()(features.token[dst]) if module.token_conditioned else None
        return module.vectors(head, features.hidden[src], prev)
    adapted: torch.Tensor = norm(module(features.hidden[src]))
    return adapted


@torch.no_grad()
def evaluate(
    module: nn.Module,
    model: PreTrainedModel,
    features: Features,
    pairs: list[tuple[torch.Tensor, torch.Tensor]],
    chunk: int = 512,
) -> dict[str, Any]:
    """Held-out loss and top-1 agreement with the target's argmax, per head (or for the adapter)."""
    res: dict[str, list[Any]] = {"loss": [], "top1": [], "n": []}
    for k, (src, dst) in enumerate(pairs):
        tot_loss, tot_hit, n = 0.0, 0, len(src)
        for i in range(0, n, chunk):
            s, d = src[i : i + chunk], dst[i : i + chunk]
            logits = target_parts(model)[2](drafter_vectors(module, model, features, s, d, k))
            tot_loss += float(distill_loss(logits, features.label_ids[d], features.label_probs[d])) * len(s)
            tot_hit += int((logits.argmax(-1) == features.label_ids[d, 0]).sum())
        res["loss"].append(tot_loss / n if n else math.nan)
        res["top1"].append(tot_hit / n if n else math.nan)
        res["n"].append(n)
    return res


def train_heads(
    model: PreTrainedModel,
    features: Features,
    settings: TrainSettings,
    progress: Callable[[str], None] | None = None,
    snapshot: Callable[[int, nn.Module], None] | None = None,
) -> TrainResult:
    """Heads (``settings.kind == "heads"``) or a layer-skip adapter, distilled on ``features``."""
    hidden_size = features.hidden.shape[-1]
    if settings.kind == "heads":
        module: MedusaHeads | LayerSkipAdapter = MedusaHeads(
            hidden_size, settings.num_heads, settings.num_layers, settings.token_conditioned
        )
    else:
        module = LayerSkipAdapter(hidden_size, settings.exit_layer, settings.num_layers)
    train_rows, eval_rows = split_sequences(features, settings.eval_fraction, settings.seed)
    train_pairs = pairs_by_head(features, settings, train_rows)
    eval_pairs = pairs_by_head(features, settings, eval_rows)
    if any(len(src) == 0 for src, _ in train_pairs):
        raise ValueError("no training pairs for some head: generate longer continuations or more prompts")
    lm_head = target_parts(model)[2]

    def step_losses(gen: torch.Generator) -> list[torch.Tensor]:
        losses = []
        for k, (src, dst) in enumerate(train_pairs):
            pick = torch.randint(len(src), (settings.batch_tokens,), generator=gen)
            s, d = src[pick], dst[pick]
            vec = drafter_vectors(module, model, features, s, d, k)
            ce = candidate_distill_loss(vec, lm_head, features.label_ids[d], features.label_probs[d])
            losses.append(ce + settings.regression_weight * regression_loss(vec, features.final[d]))
        return losses

    log = optimise(module, settings, step_losses, progress, snapshot)
    ev = evaluate(module, model, features, eval_pairs) if bool(eval_rows.any()) else {}
    return TrainResult(module=module, log=log, eval=ev)
