"""Training of a DFlash block drafter (:mod:`specstudy.engine.dflash_drafter`) on the target's own generations.

As the DFlash paper trains it: random anchor positions a in a sequence; each anchor's block is
``[token a, mask × γ]`` at positions a .. a + γ, attending to the target features of positions
< a (the context the engine will have) and to its whole block; slot i predicts token a + i, whose
target distribution (top-k) is the label.  Slot i's loss is weighted by exp(−(i − 1)/γ_w) (the
paper's decay: early slots gate every later one's acceptance).  All anchors of a sequence go
through one forward, each block masked from the others.  Loss: cross-entropy through the target's
own frozen LM head over the batch's labelled tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from ..engine.dflash_drafter import DFlashDraft
from .data import Features, target_parts
from .loop import TrainResult, TrainSettings, optimise
from .train_eagle import sequence_rows, sequence_steps

#: anchors drawn per sequence per step (all in one forward)
ANCHORS = 16
#: the slot-weight decay γ_w of the paper's loss (its value for short blocks)
DECAY = 4.0


def dflash_arch(model: PreTrainedModel, settings: TrainSettings) -> dict[str, Any]:
    """The drafter's shape for a target: its layer shape, EAGLE-3's feature layers, the block."""
    from ..engine.dflash_drafter import default_target_layers
    from ..engine.drafters import layer_shape

    cfg = model.config
    return layer_shape(cfg) | {
        "num_layers": settings.num_layers,
        "block_size": settings.block_size,
        "target_layer_ids": default_target_layers(int(cfg.num_hidden_layers)),
        "mask_token_id": settings.mask_token_id,
        "num_target_layers": int(cfg.num_hidden_layers),
        "vocab_size": int(cfg.vocab_size),
        "max_position_embeddings": int(getattr(cfg, "max_position_embeddings", 8192)),
    }


def init_from_target(module: DFlashDraft, model: PreTrainedModel) -> DFlashDraft:
    """Layers from the target's last ones (q/k norms start at one); ``norm`` from its final norm;
    ``fc`` averages the feature streams."""
    base, norm, _ = target_parts(model)
    layers = cast(nn.ModuleList, base.layers)
    h, n = module.hidden_size, len(module.target_layer_ids)
    with torch.no_grad():
        for mine, theirs in zip(module.layers, list(layers)[-len(module.layers) :]):
            for name, p in theirs.state_dict().items():
                if name in dict(mine.named_parameters()):
                    mine.get_parameter(name).copy_(p)
        module.norm.weight.copy_(cast(torch.Tensor, norm.weight))
        module.fc.weight.copy_(torch.eye(h).repeat(1, n) / n)
    return module


def anchors_of(length: int, start: int, block: int, gen: torch.Generator) -> list[int]:
    """Up to :data:`ANCHORS` distinct anchors in [start, length − 2] (a block needs one label)."""
    lo, hi = max(start, 1), length - 2
    if hi < lo:
        return []
    pick = torch.randperm(hi - lo + 1, generator=gen)[:ANCHORS] + lo
    return sorted(int(a) for a in pick)


def block_loss(
    module: DFlashDraft, model: PreTrainedModel, features: Features, idx: torch.Tensor, anchors: list[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The weighted loss of ``anchors``' blocks in one sequence (rows ``idx``, positions 0..T−1),
    and each labelled slot's (drafter vector, label row) for evaluation."""
    g, t = module.block_size - 1, len(idx)
    pos_ctx = torch.arange(t)[None]
    ctx = module.context_kv(features.hidden[idx][None], pos_ctx)
    tokens = features.token[idx]
    ids = torch.tensor([[int(tokens[a])] + [module.mask_token_id] * g for a in anchors]).reshape(1, -1)
    qpos = torch.tensor([[a + i for i in range(g + 1)] for a in anchors]).reshape(1, -1)
    block = torch.arange(len(anchors)).repeat_interleave(g + 1)
    sees_ctx = pos_ctx[0][None] < torch.tensor(anchors).repeat_interleave(g + 1)[:, None]
    allowed = torch.cat([sees_ctx, block[:, None] == block[None]], dim=1)[None]
    out = module(model.get_input_embeddings()(ids), qpos, ctx, allowed)[0]
    slot = torch.arange(g + 1).repeat(len(anchors))
    label_pos = qpos[0] - 1  # slot i's token a + i: the target's distribution at position a + i − 1
    keep = (slot > 0) & (label_pos < t)
    vec, rows, w = out[keep], idx[label_pos[keep]], torch.exp(-(slot[keep].float() - 1) / DECAY)
    lm_head = target_parts(model)[2]
    cand, inverse = torch.unique(features.label_ids[rows], return_inverse=True)
    logp = torch.log_softmax((vec @ lm_head.weight[cand].T).float(), dim=-1)
    ce = -(features.label_probs[rows] * logp.gather(-1, inverse)).sum(-1)
    return (w * ce).sum() / w.sum(), vec, rows


def train_dflash(
    model: PreTrainedModel,
    features: Features,
    settings: TrainSettings,
    progress: Callable[[str], None] | None,
    prompt_lengths: Sequence[int] | None,
    snapshot: Callable[[int, nn.Module], None] | None = None,
) -> TrainResult:
    """DFlash training: random whole sequences until ``batch_tokens`` positions per step, each with
    :data:`ANCHORS` random blocks in its generated part."""
    module = init_from_target(DFlashDraft(dflash_arch(model, settings)), model).to(dtype=features.hidden.dtype)
    plen = {s: int(prompt_lengths[s]) - 1 if prompt_lengths is not None else 0 for s in set(features.seq.tolist())}
    gen = torch.Generator().manual_seed(settings.seed)

    def loss(idx: torch.Tensor) -> torch.Tensor:
        anchors = anchors_of(len(idx), plen[int(features.seq[idx[0]])], module.block_size, gen)
        return block_loss(module, model, features, idx, anchors)[0] if anchors else idx.new_zeros((), dtype=torch.float)

    step_losses, eval_rows = sequence_steps(features, settings, 3, loss)
    log = optimise(module, settings, step_losses, progress, snapshot)
    return TrainResult(module=module, log=log, eval=evaluate_dflash(module, model, features, eval_rows, plen))


def evaluate_dflash(
    module: DFlashDraft, model: PreTrainedModel, features: Features, eval_rows: torch.Tensor, plen: dict[int, int]
) -> dict[str, Any]:
    """Held-out top-1 per block slot against the target's argmax, at every generated anchor."""
    if not bool(eval_rows.any()):
        return {}
    g = module.block_size - 1
    hits, total = [0] * g, [0] * g
    lm_head = target_parts(model)[2]
    with torch.no_grad():
        for s, idx in sequence_rows(features, eval_rows).items():
            anchors = list(range(max(plen[s], 1), len(idx) - 1))
            if not anchors:
                continue
            _, vec, rows = block_loss(module, model, features, idx, anchors)
            right = (lm_head(vec).argmax(-1) == features.label_ids[rows, 0]).tolist()
            slots = [i for a in anchors for i in range(g) if a + i + 1 - 1 < len(idx)]
            for i, r in zip(slots, right):
                hits[i] += int(r)
                total[i] += 1
    return {
        "top1_per_slot": [h / n if n else math.nan for h, n in zip(hits, total)],
        "n": total,
        "positions": "every generated anchor of the held-out sequences",
        "mode": "teacher-forced context (the target's own features); slot i drafts token anchor + i",
    }
