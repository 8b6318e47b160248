"""``mtp`` — a multi-token-prediction layer in MiMo's layout (:mod:`specstudy.engine.mtp_drafter`).

The drafting loop is ``eagle``'s (:class:`~specstudy.engine.methods.eagle.EagleDrafter`), as vLLM
runs MTP layers through its EAGLE proposer: per step the pairs (h_j, token j+1) the last target pass
produced go into the layer's cache, then it drafts γ tokens feeding its own output back (vLLM
reuses its one layer for every draft position).  What differs from ``eagle``:

* h_j is the target's residual stream after its last layer, before the final norm (vLLM's MiMo
  model hands that to its MTP layer);
* the embedding of the token at position 0 is zeroed, and the layer's input is
  ``[hidden; embedding]`` through ``input_proj`` (MiMo's order);
* the fed-back vector is the layer's output after its ``final_layernorm``, which the target's LM
  head reads directly.

``drafter``: a folder from ``specstudy train-drafter --kind mtp`` (config.json + model.safetensors
with the MTP layer's MiMo tensor names).  vLLM runs the same layer beside the target's own layers
as a MiMo model (:mod:`specstudy.backends.vllm.mimo_export`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..mtp_drafter import MtpDraft, load_mtp, read_mtp_config
from ..trace import RowTrace
from . import SYNTHETIC, DecodeJob, EngineMethod, job_drafter
from .eagle import EAGLE_OPTIONS, decode_with
from .eagle3 import resolve_folder
from .heads import HiddenCapture

#: what a study is checked against, read as a literal (no import, no torch) by
#: specstudy.frameworks.reference; SPEC below is built from it
HEADER = {
    "name": "mtp",
    "family": "heads",
    "order": 75,
    "needs_drafter": True,
    "uses_gamma": True,
    "max_batch": None,
    "options": ("synthetic_acceptance",),
}


def load(name: str, target: Any, device: str = "cpu", dtype: str = "float32") -> MtpDraft:
    """cell.drafter (an MTP folder) → the layer, in the target's dtype and on its device."""
    draft = load_mtp(resolve_folder(name), target.config)
    return draft.to(device=device, dtype=next(target.parameters()).dtype)


def decode(job: DecodeJob) -> list[RowTrace]:
    draft = job_drafter(job, MtpDraft, "mtp", what="the layer's")
    with HiddenCapture(job.target, before_norm=True) as capture:
        return decode_with(job, draft, capture)


@dataclass(frozen=True)
class MtpSpec(EngineMethod):
    """Checks that the drafter is an MTP folder before any model is loaded."""

    def check(self, gamma: int | None, batch_size: int, drafter: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        out = EngineMethod.check(self, gamma, batch_size, drafter, options)
        if not isinstance(drafter, MtpDraft):
            read_mtp_config(resolve_folder(drafter))
        return out


SPEC = MtpSpec.from_header(
    HEADER,
    decode=decode,
    load_drafter=load,
    options={SYNTHETIC: EAGLE_OPTIONS[SYNTHETIC]},
    description="multi-token-prediction layer in MiMo's layout (the target's pre-norm last hidden state and "
    "the next token's embedding); drafter: an MTP folder from `specstudy train-drafter --kind mtp`",
)
