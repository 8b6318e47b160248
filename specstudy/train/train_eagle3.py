"""Training of the EAGLE-3 drafter: the target's low/middle/high features, a reduced draft vocabulary,
and EAGLE-3's training-time test (the drafter's own outputs fed back for ``unroll`` steps).

Sequence of pairs j = 0..L-1: (features_j, token j+1) predicts token j+2.  Unrolled step m ≥ 2 of
the chain after pair c feeds the previous step's output with token c+m at position c+m−1 and
predicts token c+m+1; it attends to the true pairs 0..c and to its own chain's earlier steps,
exactly what drafting does at inference (:mod:`specstudy.engine.methods.eagle`).  Loss: the
target's top-k distribution restricted to the draft vocabulary (renormalised), cross-entropy
over the batch's labelled draft ids, summed over steps.
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

from ..engine.eagle3_drafter import Eagle3Draft
from ..engine.mtp_drafter import MtpDraft
from .data import Features, target_parts
from .loop import TrainResult, TrainSettings, optimise
from .train_eagle import sequence_rows, sequence_steps


def choose_draft_vocab(features: Features, vocab_size: int, size: int) -> torch.Tensor:
    """The ``size`` target ids with the most expected occurrences under the target's next-token
    distributions (label probabilities summed), ties and unseen ids by id; ascending."""
    size = min(size, vocab_size)
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    mass.index_add_(0, features.label_ids.flatten(), features.label_probs.flatten().double())
    order = sorted(range(vocab_size), key=lambda v: (-float(mass[v]), v))
    return torch.tensor(sorted(order[:size]), dtype=torch.long)


def init_from_target(module: Eagle3Draft, model: PreTrainedModel) -> Eagle3Draft:
    """LM head rows and final norm from the target's; ``fc`` passes the highest feature through."""
    _, norm, lm_head = target_parts(model)
    h = module.hidden_size
    with torch.no_grad():
        module.lm_head.weight.copy_(lm_head.weight[module.draft_vocab])
        module.norm.weight.copy_(cast(torch.Tensor, norm.weight))
        module.fc.weight.zero_()
        module.fc.weight[:, -h:] = torch.eye(h)
    return module


def chain_mask(length: int, steps: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Additive attention mask ``[1, 1, N, N]`` and positions ``[1, N]`` over steps 1..``steps`` of
    every chain, step m holding chains c = 0..length−m (see the module docstring)."""
    keys = [(m, c) for m in range(1, steps + 1) for c in range(length - m + 1)]
    step = torch.tensor([m for m, _ in keys])
    chain = torch.tensor([c for _, c in keys])
    true_prefix = (step[None, :] == 1) & (chain[None, :] <= chain[:, None])
    own_chain = (step[None, :] >= 2) & (chain[None, :] == chain[:, None]) & (step[None, :] <= step[:, None])
    allowed = true_prefix | own_chain
    mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, float("-inf"))
    return mask[None, None], (chain + step - 1)[None]


def unrolled_outputs(
    module: Eagle3Draft | MtpDraft, emb: torch.Tensor, aux: torch.Tensor, steps: int
) -> list[torch.Tensor]:
    """Outputs of steps 1..``steps`` for one sequence of L+1 tokens: ``emb [L+1, H]`` their
    embeddings, ``aux [L+1, 3H]`` the target's features (``[L+1, H]`` for an MTP layer, whose
    ``fc`` is the identity); step m's output has one row per chain c = 0..L−m (``[L−m+1, H]``,
    the vector the drafter feeds back)."""
    n_pairs = len(emb) - 1
    fc = module.fc(aux[:-1])
    outs: list[torch.Tensor] = []
    for m in range(1, steps + 1):
        if n_pairs - m + 1 < 1:
            break
        feats = [fc] + [outs[k - 1][: n_pairs - k] for k in range(1, m)]
        toks = [emb[1 + k : 1 + k + n_pairs - k] for k in range(m)]
        mask, pos = chain_mask(n_pairs, m, emb.dtype)
        x = torch.cat([torch.cat(toks), torch.cat(feats)], dim=-1)[None]
        layer = module.decoder.layers[0]
        y = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=module.decoder.rotary_emb(x, pos))
        outs.append(y[0, -(n_pairs - m + 1) :])
    return outs


def draft_vocab_loss(
    module: Eagle3Draft, vectors: torch.Tensor, label_ids: torch.Tensor, label_probs: torch.Tensor
) -> torch.Tensor:
    """Cross-entropy against the target's top-k labels inside the draft vocabulary (renormalised),
    the softmax over the draft ids labelled in the batch (as :func:`candidate_distill_loss`)."""
    to_draft = torch.full((module.vocab_size,), -1, dtype=torch.long)
    to_draft[module.draft_vocab] = torch.arange(len(module.d2t))
    d = to_draft[label_ids]
    probs = label_probs * (d >= 0)
    probs = probs / probs.sum(-1, keepdim=True).clamp(min=1e-12)
    cand, inverse = torch.unique(d.clamp(min=0), return_inverse=True)
    logp = torch.log_softmax((module.norm(vectors) @ module.lm_head.weight[cand].T).float(), dim=-1)
    return -(probs * logp.gather(-1, inverse)).sum(-1).mean()


def sequence_loss(
    module: Eagle3Draft, model: PreTrainedModel, features: Features, idx: torch.Tensor, steps: int
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Summed loss of the unrolled steps over one sequence (rows ``idx``) and their outputs."""
    emb = model.get_input_embeddings()(features.token[idx])
    outs = unrolled_outputs(module, emb, features.hidden[idx], steps)
    terms = [
        draft_vocab_loss(module, o, features.label_ids[idx[m : m + len(o)]], features.label_probs[idx[m : m + len(o)]])
        for m, o in enumerate(outs, start=1)
    ]
    return functools.reduce(operator.add, terms), outs


def train_eagle3(
    model: PreTrainedModel,
    features: Features,
    settings: TrainSettings,
    progress: Callable[[str], None] | None,
    prompt_lengths: Sequence[int] | None,
    snapshot: Callable[[int, nn.Module], None] | None = None,
) -> TrainResult:
    """EAGLE-3 training: random whole sequences until ``batch_tokens`` pairs per step."""
    vocab = choose_draft_vocab(features, int(model.config.vocab_size), settings.draft_vocab_size)
    module = init_from_target(Eagle3Draft.for_target(model.config, vocab), model).to(dtype=features.hidden.dtype)
    step_losses, eval_rows = sequence_steps(
        features, settings, 3, lambda idx: sequence_loss(module, model, features, idx, settings.unroll)[0]
    )
    log = optimise(module, settings, step_losses, progress, snapshot)
    return TrainResult(module=module, log=log, eval=evaluate(module, model, features, eval_rows, prompt_lengths))


def evaluate(
    module: Eagle3Draft,
    model: PreTrainedModel,
    features: Features,
    eval_rows: torch.Tensor,
    prompt_lengths: Sequence[int] | None,
) -> dict[str, Any]:
    """Held-out top-1 of step 1 (teacher-forced features) against the target's argmax, on generated
    positions, and how often that argmax lies in the draft vocabulary at all."""
    if not bool(eval_rows.any()):
        return {}
    hits = total = covered = 0
    with torch.no_grad():
        for s, idx in sequence_rows(features, eval_rows).items():
            if len(idx) < 3:
                continue
            _, outs = sequence_loss(module, model, features, idx, 1)
            start = max(int(prompt_lengths[s]) - 2, 0) if prompt_lengths is not None else 0
            want = features.label_ids[idx[1:], 0][start:]
            got = module.target_logits(outs[0][start:]).argmax(-1)
            hits += int((got == want).sum())
            covered += int(module.t2d[want].sum())
            total += len(want)
    return {
        "top1": [hits / total if total else math.nan],
        "target_top1_in_draft_vocab": covered / total if total else math.nan,
        "n": [total],
        "positions": "generated" if prompt_lengths is not None else "all",
        "mode": "teacher-forced (the target's own features as input): the first draft of a step",
    }
