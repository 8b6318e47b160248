"""Training of the EAGLE-style drafter: whole sequences, teacher-forced with the target's own features."""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from ..engine.drafters import EagleDraft
from .data import Features, target_parts
from .loop import TrainResult, TrainSettings, optimise, split_sequences
from .losses import candidate_distill_loss, distill_loss, regression_loss


def sequence_rows(features: Features, rows: torch.Tensor) -> dict[int, torch.Tensor]:
    """Row indices of each sequence with rows in ``rows``, in position order."""
    out: dict[int, torch.Tensor] = {}
    for s in sorted(set(features.seq[rows].tolist())):
        idx = torch.nonzero((features.seq == s) & rows).squeeze(1)
        out[s] = idx[torch.argsort(features.pos[idx])]
    return out


def length_weighted(
    seqs: Sequence[torch.Tensor],
    batch_tokens: int,
    gen: torch.Generator,
    loss: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """One step's loss: random sequences (rows) until ``batch_tokens`` pairs, each sequence's
    ``loss`` weighted by its number of pairs (len − 1)."""
    picked, n = [], 0
    while n < batch_tokens:
        idx = seqs[int(torch.randint(len(seqs), (1,), generator=gen))]
        picked.append(idx)
        n += len(idx) - 1
    terms = [loss(idx) * (len(idx) - 1) for idx in picked]
    return functools.reduce(operator.add, terms) / n  # sum(), typed: the same additions in order


def sequence_steps(
    features: Features, settings: TrainSettings, min_len: int, loss: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[Callable[[torch.Generator], list[torch.Tensor]], torch.Tensor]:
    """The optimiser's step over whole training sequences of at least ``min_len`` positions
    (:func:`length_weighted` of ``loss``), and the held-out rows."""
    train_rows, eval_rows = split_sequences(features, settings.eval_fraction, settings.seed)
    seqs = [v for v in sequence_rows(features, train_rows).values() if len(v) >= min_len]
    if not seqs:
        raise ValueError(f"no training sequence of {min_len} or more positions")
    return (lambda gen: [length_weighted(seqs, settings.batch_tokens, gen, loss)]), eval_rows


def eagle_sequence_loss(
    module: EagleDraft, model: PreTrainedModel, features: Features, idx: torch.Tensor, regression_weight: float
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


def train_eagle(
    model: PreTrainedModel,
    features: Features,
    settings: TrainSettings,
    progress: Callable[[str], None] | None,
    prompt_lengths: Sequence[int] | None,
    snapshot: Callable[[int, nn.Module], None] | None = None,
) -> TrainResult:
    """EAGLE-style training: whole sequences, teacher-forced with the target's own features;
    each step takes random sequences until ``batch_tokens`` positions, loss weighted by length."""
    module = EagleDraft.for_target(model.config).to(dtype=features.final.dtype)
    step_losses, eval_rows = sequence_steps(
        features,
        settings,
        2,
        lambda idx: eagle_sequence_loss(module, model, features, idx, settings.regression_weight)[0],
    )
    log = optimise(module, settings, step_losses, progress, snapshot)
    ev: dict[str, Any] = {}
    if bool(eval_rows.any()):
        hits = total = 0
        loss_sum = 0.0
        with torch.no_grad():
            for s, idx in sequence_rows(features, eval_rows).items():
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
