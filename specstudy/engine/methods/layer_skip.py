"""layer_skip: self-speculation — the target's first k layers, its final norm and LM head draft.

No second model: the drafter is a view of the target that exits after layer k (LayerSkip /
"early exit" drafting).  Untrained, the early exit's acceptance is whatever the model gives
(report it honestly); an optional ``adapter`` module (trained by ``specstudy train-drafter``)
maps the layer-k hidden state before the final norm.  The draft keeps its own KV cache for
its k layers (the target's cache of those layers is not shared: simpler, and the same cost).

Options: ``exit_layer`` (k, layers kept) or ``skip_layers`` (layers skipped, k = L − skip);
default k = L // 2, or the adapter's own exit layer.  ``adapter`` is a module or the path of a
``layer_skip_adapter`` file (``params/drafters/...``), so a study cell can name it.
``synthetic_acceptance`` keeps drafts at a fixed rate (:mod:`specstudy.synthetic`).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from ...synthetic import parse_synthetic
from ..drafters import load_drafter
from ..kv import cache_arg
from ..speculate import ModelDrafter
from ..trace import RowTrace
from . import (
    DRAFT_IN_PREFILL,
    SYNTHETIC,
    DecodeJob,
    EngineMethod,
    chain_decode,
    draft_in_prefill,
    positive_int,
)

#: what a study is checked against, read as a literal (no import, no torch) by
#: specstudy.frameworks.reference; SPEC below is built from it
HEADER = {
    "name": "layer_skip",
    "family": "layer_skip",
    "order": 30,
    "needs_drafter": False,
    "uses_gamma": True,
    "max_batch": None,
    "options": ("exit_layer", "skip_layers", "adapter", "draft_in_prefill", "synthetic_acceptance"),
    "title": "Self-speculation (layer skip)",
    "drafts_from": "target's first layers",
}


def _decoder(target: Any) -> Any:
    base = getattr(target, "model", None)
    for name in ("embed_tokens", "layers", "norm", "rotary_emb"):
        if base is None or not hasattr(base, name):
            raise ValueError(
                f"layer_skip needs a Llama-style decoder (model.embed_tokens/layers/norm/rotary_emb); "
                f"{type(target).__name__} has no model.{name}"
            )
    types = getattr(target.config, "layer_types", None) or []
    if any(t != "full_attention" for t in types):
        raise ValueError(f"layer_skip supports full-attention layers only; config.layer_types={sorted(set(types))}")
    return base


def exit_layer(target: Any, options: dict) -> int:
    n_layers = target.config.num_hidden_layers
    if "exit_layer" in options and "skip_layers" in options:
        raise ValueError("give exit_layer or skip_layers, not both")
    k = options.get("exit_layer", n_layers - options["skip_layers"] if "skip_layers" in options else n_layers // 2)
    if not 1 <= k < n_layers:
        raise ValueError(f"exit layer k={k}: need 1 <= k < num_hidden_layers={n_layers}")
    return k


class LayerSkipDraft(torch.nn.Module):
    """The target's first ``k`` layers + final norm + LM head, called like a causal LM.

    Holds references to the target's modules (no copy of any weight).
    """

    cache_config = None  # its cache has k layers, not the target config's L

    def __init__(self, target: Any, k: int, adapter: torch.nn.Module | None = None):
        super().__init__()
        _decoder(target)
        object.__setattr__(self, "_target", target)  # not registered: parameters stay the target's
        self.config = target.config
        self.k = k
        self.adapter = adapter

    def lean_layers(self) -> tuple[Any, int] | None:
        """(target, k) for the lean forward (:mod:`specstudy.engine.lean`): the first k layers, the
        final norm and the LM head; None with an adapter (the lean forward has none)."""
        return (self._target, self.k) if self.adapter is None else None

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache: Any = None,
        use_cache: bool = True,
        logits_to_keep: int = 0,
    ) -> SimpleNamespace:
        from transformers.masking_utils import create_causal_mask

        base = self._target.model
        h = base.embed_tokens(input_ids)
        if position_ids is None:
            past = cache.get_seq_length() if cache is not None else 0
            position_ids = (torch.arange(h.shape[1], device=h.device) + past)[None]
        mask = create_causal_mask(
            config=self.config,
            inputs_embeds=h,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **cache_arg(create_causal_mask, cache),
        )
        pos_emb = base.rotary_emb(h, position_ids=position_ids)
        for layer in base.layers[: self.k]:
            h = layer(
                h,
                attention_mask=mask,
                position_embeddings=pos_emb,
                position_ids=position_ids,
                use_cache=use_cache,
                **cache_arg(layer, cache),
            )
        if self.adapter is not None:
            h = self.adapter(h)
        h = base.norm(h)
        if logits_to_keep:
            h = h[:, -logits_to_keep:]
        return SimpleNamespace(logits=self._target.lm_head(h))


def early_exit_draft(target: Any, options: dict, device: Any) -> LayerSkipDraft:
    """The target's first k layers as a draft model (``layer_skip``, and ``tree``'s ``self[:K]``
    and adapter-file drafters).  With ``options["adapter"]`` (a trained module) k defaults to the
    adapter's own exit layer and must agree with it, as must its width; the adapter follows the
    target's device and dtype (a file loads in fp32 on the CPU)."""
    options = dict(options)
    adapter = options.get("adapter")
    if getattr(adapter, "hidden_size", None) not in (None, target.config.hidden_size):
        raise ValueError(
            f"method 'layer_skip': the adapter's hidden_size {adapter.hidden_size} is not the target's "
            f"{target.config.hidden_size}"
        )
    if adapter is not None and hasattr(adapter, "exit_layer"):
        if options.setdefault("exit_layer", adapter.exit_layer) != adapter.exit_layer or "skip_layers" in options:
            raise ValueError(
                f"method 'layer_skip': the adapter was trained at exit layer {adapter.exit_layer}; "
                f"got exit_layer={options.get('exit_layer')!r}, skip_layers={options.get('skip_layers')!r}"
            )
    if adapter is not None:
        adapter = adapter.to(device=device, dtype=next(target.parameters()).dtype)
    return LayerSkipDraft(target, exit_layer(target, options), adapter)


def decode(job: DecodeJob) -> list[RowTrace]:
    draft = early_exit_draft(job.target, dict(job.options), job.device)
    gen = job.generator()
    drafter = ModelDrafter(draft, len(job.prompts), job.sampling, gen, job.device)
    return chain_decode(job, drafter, gen, prefill=draft_in_prefill(job))


def _adapter(v: Any) -> Any:
    """A module, or the path of a ``layer_skip_adapter`` file written by ``train-drafter``."""
    if isinstance(v, (str, Path)):
        return load_drafter(v, kind="layer_skip_adapter")
    if v is not None and not isinstance(v, torch.nn.Module):
        raise ValueError("need a torch.nn.Module mapping hidden states, a layer_skip_adapter file path, or None")
    return v


def _cross_check(options: dict) -> None:
    if "exit_layer" in options and "skip_layers" in options:
        raise ValueError("method 'layer_skip': give exit_layer or skip_layers, not both")


SPEC = EngineMethod.from_header(
    HEADER,
    decode=decode,
    options={
        "exit_layer": positive_int,
        "skip_layers": positive_int,
        "adapter": _adapter,
        "draft_in_prefill": DRAFT_IN_PREFILL,
        SYNTHETIC: parse_synthetic,
    },
    cross_check=_cross_check,
    description="self-speculation: the target's first k layers + LM head draft",
)
