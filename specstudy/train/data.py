"""Training data: the target's own greedy generations and the distillation features read from them."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def target_parts(model: PreTrainedModel) -> tuple[nn.Module, nn.Module, nn.Linear]:
    """(decoder stack, final norm, LM head) of a transformers causal LM."""
    base = getattr(model, model.base_model_prefix)
    return base, base.norm, cast(nn.Linear, model.get_output_embeddings())  # type: ignore[no-untyped-call]  # untyped in transformers


#: drafters that attend to every position's features, the prompt's included: their features come
#: from one target pass over each finished sequence
FEATURE_KINDS = ("eagle", "eagle3", "mtp", "dflash")


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
    model: PreTrainedModel,
    corpus: Sequence[tuple[list[int], int]],
    kind: str,
    exit_layer: int | None = None,
    label_top_k: int = 32,
) -> Features:
    """Run the target over each sequence once; keep positions from the last prompt token on
    (``eagle``, ``eagle3``, ``mtp``: every position, since their drafters attend to the prompt's
    features too).  ``eagle3``: ``hidden`` holds the streams entering its feature layers,
    concatenated; ``dflash``: the streams after its target layers (EAGLE-3's three, the same
    streams), concatenated; ``mtp``: the stream after the last layer, before the final norm."""
    from ..engine.dflash_drafter import default_target_layers
    from ..engine.eagle3_drafter import default_aux_layers

    base, norm, lm_head = target_parts(model)
    n_layers = model.config.num_hidden_layers
    aux: Sequence[int] = default_aux_layers(n_layers) if kind == "eagle3" else ()
    if kind == "dflash":
        aux = [i + 1 for i in default_target_layers(n_layers)]
    hs, fin, lid, lpr, seqs, poss, toks = [], [], [], [], [], [], []
    pre_norm: list[torch.Tensor] = []
    hook = norm.register_forward_pre_hook(lambda m, args: pre_norm.append(args[0])) if kind == "mtp" else None
    for s, (ids, plen) in enumerate(corpus):
        x = torch.tensor([ids])
        out = base(input_ids=x, output_hidden_states=kind in ("layer_skip_adapter", "eagle3", "dflash"))
        last = out.last_hidden_state[0]
        probs = torch.softmax(lm_head(last).float(), dim=-1)
        top = torch.topk(probs, label_top_k, dim=-1)
        start = 0 if kind in FEATURE_KINDS else max(plen - 1, 0)
        h = out.hidden_states[exit_layer][0] if kind == "layer_skip_adapter" else last
        if kind == "mtp":
            h = pre_norm.pop()[0]
        if aux:
            h = torch.cat([out.hidden_states[k][0] for k in aux], dim=-1)
        hs.append(h[start:])
        fin.append(last[start:])
        lid.append(top.indices[start:])
        lpr.append(top.values[start:] / top.values[start:].sum(-1, keepdim=True))
        seqs.append(torch.full((len(ids) - start,), s))
        poss.append(torch.arange(start, len(ids)))
        toks.append(torch.tensor(ids[start:]))
    if hook is not None:
        hook.remove()
    final = torch.cat(fin)
    hidden = final if kind == "heads" else torch.cat(hs)
    return Features(hidden, final, torch.cat(lid), torch.cat(lpr), torch.cat(seqs), torch.cat(poss), torch.cat(toks))


@torch.no_grad()
def generate_with_features(
    model: PreTrainedModel,
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
    token, whose next-token distribution the step computed).  ``eagle``, ``eagle3``: features of every
    position, prompt included, from one target pass over each finished sequence
    (:func:`collect_features`), since its drafter attends to the prompt's features too.
    """
    if kind in FEATURE_KINDS:
        generated, _ = generate_with_features(
            model, prompts, max_new_tokens, "heads", None, label_top_k, batch_size, pad_id, progress
        )
        return generated, collect_features(model, generated, kind, label_top_k=label_top_k)

    config = copy.deepcopy(model.generation_config)
    config.eos_token_id = None
    config.update(  # type: ignore[no-untyped-call]  # untyped in transformers
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
        # PreTrainedModel declares no generate (the causal LM classes get it from GenerationMixin)
        out = model.generate(input_ids=ids, attention_mask=att, generation_config=config)  # type: ignore[operator]
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
