"""Training of an MTP layer (:mod:`specstudy.engine.mtp_drafter`) on the target's own generations.

The same sequence-level training-time test as EAGLE-3's (:func:`~specstudy.train.train_eagle3.unrolled_outputs`):
pair j = (h_j, token j+1) predicts token j+2; unrolled step m ≥ 2 feeds the previous step's output
back with the next token, as vLLM drafts γ > 1 tokens with its one MTP layer.  h_j is the target's
pre-norm last hidden state.  Loss: the target's top-k distribution at the predicted position,
cross-entropy through the target's own (frozen) LM head over the batch's labelled tokens, summed
over steps.
"""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from ..engine.mtp_drafter import MtpDraft
from .data import Features, target_parts
from .loop import TrainResult, TrainSettings, optimise
from .losses import candidate_distill_loss
from .train_eagle import sequence_rows, sequence_steps
from .train_eagle3 import unrolled_outputs


def init_mtp_from_target(module: MtpDraft, model: PreTrainedModel) -> MtpDraft:
    """The decoder layer from the target's last; ``final_layernorm`` from its final norm (the LM head
    reads the output); ``input_proj`` adds the two normed inputs."""
    base, norm, _ = target_parts(model)
    layer, h = module.layer, module.hidden_size
    last = cast(nn.Module, base.layers[-1])  # type: ignore[index]  # an nn.ModuleList
    with torch.no_grad():
        for name, p in last.state_dict().items():
            layer.get_parameter(name).copy_(p)
        layer.get_parameter("final_layernorm.weight").copy_(cast(torch.Tensor, norm.weight))
        proj = layer.get_parameter("input_proj.weight")
        proj.zero_()
        proj[:, :h] = torch.eye(h)
        proj[:, h:] = torch.eye(h)
    return module


def mtp_sequence_loss(
    module: MtpDraft, model: PreTrainedModel, features: Features, idx: torch.Tensor, steps: int
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Summed loss of the unrolled steps over one sequence (rows ``idx``) and their outputs."""
    lm_head = target_parts(model)[2]
    emb = model.get_input_embeddings()(features.token[idx])
    outs = unrolled_outputs(module, emb, features.hidden[idx], steps)
    terms = [
        candidate_distill_loss(
            o, lm_head, features.label_ids[idx[m : m + len(o)]], features.label_probs[idx[m : m + len(o)]]
        )
        for m, o in enumerate(outs, start=1)
    ]
    return functools.reduce(operator.add, terms), outs


def train_mtp(
    model: PreTrainedModel,
    features: Features,
    settings: TrainSettings,
    progress: Callable[[str], None] | None,
    prompt_lengths: Sequence[int] | None,
    snapshot: Callable[[int, nn.Module], None] | None = None,
) -> TrainResult:
    """MTP training: random whole sequences until ``batch_tokens`` pairs per step."""
    module = init_mtp_from_target(MtpDraft.for_target(model.config), model).to(dtype=features.hidden.dtype)
    step_losses, eval_rows = sequence_steps(
        features, settings, 3, lambda idx: mtp_sequence_loss(module, model, features, idx, settings.unroll)[0]
    )
    log = optimise(module, settings, step_losses, progress, snapshot)
    return TrainResult(module=module, log=log, eval=evaluate_mtp(module, model, features, eval_rows, prompt_lengths))


def evaluate_mtp(
    module: MtpDraft,
    model: PreTrainedModel,
    features: Features,
    eval_rows: torch.Tensor,
    prompt_lengths: Sequence[int] | None,
) -> dict[str, Any]:
    """Held-out top-1 of step 1 (the target's own hidden states as input) against the target's
    argmax, on generated positions."""
    if not bool(eval_rows.any()):
        return {}
    hits = total = 0
    lm_head = target_parts(model)[2]
    with torch.no_grad():
        for s, idx in sequence_rows(features, eval_rows).items():
            if len(idx) < 3:
                continue
            _, outs = mtp_sequence_loss(module, model, features, idx, 1)
            start = max(int(prompt_lengths[s]) - 2, 0) if prompt_lengths is not None else 0
            want = features.label_ids[idx[1:], 0][start:]
            hits += int((lm_head(outs[0][start:]).argmax(-1) == want).sum())
            total += len(want)
    return {
        "top1": [hits / total if total else math.nan],
        "n": [total],
        "positions": "generated" if prompt_lengths is not None else "all",
        "mode": "teacher-forced (the target's own hidden states as input): the first draft of a step",
    }
