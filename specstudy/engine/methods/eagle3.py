"""``eagle3`` — EAGLE-3 drafting from the checkpoint vLLM and SGLang load (:mod:`specstudy.engine.eagle3_drafter`).

The drafting loop is ``eagle``'s (:class:`~specstudy.engine.methods.eagle.EagleDrafter`): per
step the pairs (feature_j, token j+1) the last target pass produced go into the drafter's cache,
then it drafts γ tokens feeding its own output back.  What differs:

* the features are the target's residual stream entering three layers (low, middle, high),
  concatenated and mapped by the drafter's ``fc`` (:class:`~specstudy.engine.methods.heads.AuxCapture`);
* the fed-back feature is the midlayer's output before the drafter's final norm (as both engines);
* option ``tree_nodes`` (and ``tree_topk``) grows EAGLE-2's dynamic tree, as for ``eagle``;
* drafts come from the drafter's own LM head over its reduced vocabulary, mapped to target ids
  by ``d2t``; tokens outside it get probability 0 in q, which exact rejection sampling allows.

``drafter``: a folder from ``specstudy train-drafter --kind eagle3`` (or any EAGLE-3 checkpoint
of a Llama-style target with one midlayer) holding ``config.json`` and ``model.safetensors``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...paths import REPO_ROOT
from ..eagle3_drafter import Eagle3Draft, load_eagle3, read_eagle3_config
from ..trace import RowTrace
from . import DecodeJob, EngineMethod, job_drafter
from .eagle import EAGLE_OPTIONS, check_tree_batch, check_tree_options, decode_with
from .heads import AuxCapture

#: what a study is checked against, read as a literal (no import, no torch) by
#: specstudy.frameworks.reference; SPEC below is built from it
HEADER = {
    "name": "eagle3",
    "family": "heads",
    "order": 70,
    "needs_drafter": True,
    "uses_gamma": True,
    "max_batch": None,
    "options": ("synthetic_acceptance", "tree_nodes", "tree_topk"),
    "seed_row": "EAGLE-2",
    "option_defaults": {"tree_topk": 4},
    "describe_when": {
        "tree_nodes": "EAGLE-2's dynamic tree of {tree_nodes} nodes (top-{tree_topk} expansion, depth {gamma}), verified in one forward",
    },
}


def resolve_folder(name: str | Path) -> Path:
    """A drafter folder as given (from the working directory), else relative to the repository."""
    p = Path(name).expanduser()
    if not p.exists() and not p.is_absolute() and (REPO_ROOT / p).exists():
        p = REPO_ROOT / p
    return p


def load(name: str, target: Any, device: str = "cpu", dtype: str = "float32") -> Eagle3Draft:
    """cell.drafter (an EAGLE-3 folder) → the drafter, in the target's dtype and on its device."""
    draft = load_eagle3(resolve_folder(name), target.config)
    return draft.to(device=device, dtype=next(target.parameters()).dtype)


def decode(job: DecodeJob) -> list[RowTrace]:
    draft = job_drafter(job, Eagle3Draft, "eagle3", vocab=True)
    with AuxCapture(job.target, draft.aux_layers) as capture:
        return decode_with(job, draft, capture)


@dataclass(frozen=True)
class Eagle3Spec(EngineMethod):
    """Checks that the drafter is an EAGLE-3 folder before any model is loaded."""

    def check(self, gamma: int | None, batch_size: int, drafter: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        out = EngineMethod.check(self, gamma, batch_size, drafter, options)
        check_tree_batch(out, batch_size)
        if not isinstance(drafter, Eagle3Draft):
            read_eagle3_config(resolve_folder(drafter))
        return out


SPEC = Eagle3Spec.from_header(
    HEADER,
    decode=decode,
    load_drafter=load,
    options=EAGLE_OPTIONS,
    cross_check=check_tree_options,
    description="EAGLE-3 drafter (features from three target layers, reduced draft vocabulary); drafter: "
    "an EAGLE-3 folder (config.json + model.safetensors) as vLLM and SGLang load it, e.g. from "
    "`specstudy train-drafter --kind eagle3`",
)
