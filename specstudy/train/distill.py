"""The entry point of drafter training (``specstudy train-drafter``): one call for every kind."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers import PreTrainedModel

from .data import Features
from .loop import TrainResult, TrainSettings
from .train_dflash import train_dflash
from .train_eagle import train_eagle
from .train_eagle3 import train_eagle3
from .train_heads import train_heads
from .train_mtp import train_mtp


def train_drafter(
    model: PreTrainedModel,
    features: Features,
    settings: TrainSettings,
    progress: Callable[[str], None] | None = None,
    prompt_lengths: Sequence[int] | None = None,
    snapshot: Callable[[int, nn.Module], None] | None = None,
) -> TrainResult:
    """Distil a drafter on ``features`` (target frozen); log train loss every ~5 % of the steps.

    ``prompt_lengths[s]`` (eagle): sequence s's prompt length, so the held-out top-1 is
    reported on generated positions, as for the other kinds.  ``snapshot(step, module)`` runs after
    each step in ``settings.snapshots`` (the command saves the drafter so far).
    """
    torch.manual_seed(settings.seed)
    for p in model.parameters():
        p.requires_grad_(False)
    if settings.kind == "eagle":
        return train_eagle(model, features, settings, progress, prompt_lengths, snapshot)
    if settings.kind == "eagle3":
        return train_eagle3(model, features, settings, progress, prompt_lengths, snapshot)
    if settings.kind == "dflash":
        return train_dflash(model, features, settings, progress, prompt_lengths, snapshot)
    if settings.kind == "mtp":
        return train_mtp(model, features, settings, progress, prompt_lengths, snapshot)
    return train_heads(model, features, settings, progress, snapshot)
