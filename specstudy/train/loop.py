"""What every drafter kind's training shares: settings, the held-out split, the optimiser loop."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from ..engine.dflash_drafter import DFlashDraft
from ..engine.drafters import KINDS, TrainedDrafter
from ..engine.eagle3_drafter import Eagle3Draft
from ..engine.mtp_drafter import MtpDraft
from .data import Features


@dataclass
class TrainSettings:
    kind: str = "heads"
    num_heads: int = 4
    num_layers: int = 1
    token_conditioned: bool = False
    exit_layer: int = 8
    steps: int = 600
    batch_tokens: int = 256
    lr: float = 1e-3
    weight_decay: float = 0.0
    label_top_k: int = 32
    regression_weight: float = 1.0
    draft_vocab_size: int = 8192  # eagle3: target ids the drafter's LM head covers
    unroll: int = 2  # eagle3, mtp: training-time-test steps (the drafter's own outputs fed back)
    block_size: int = 5  # dflash: one bonus slot and block_size - 1 mask slots (γ <= block_size - 1)
    mask_token_id: int = 16  # dflash: the token filling the mask slots (SmolLM2's unused <empty_output>)
    seed: int = 0
    eval_fraction: float = 0.1
    snapshots: tuple[int, ...] = ()  # steps after which the drafter so far is handed to ``snapshot``

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r}: allowed {KINDS}")
        for name in (
            "num_heads",
            "num_layers",
            "exit_layer",
            "steps",
            "batch_tokens",
            "label_top_k",
            "draft_vocab_size",
            "unroll",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be >= 1")
        if self.block_size < 2 or self.mask_token_id < 0:
            raise ValueError(f"block_size={self.block_size!r} (>= 2), mask_token_id={self.mask_token_id!r} (>= 0)")
        bad = [s for s in self.snapshots if not 1 <= s <= self.steps]
        if bad:
            raise ValueError(f"snapshots={bad!r}: each must lie in [1, steps={self.steps}]")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction={self.eval_fraction!r}: must lie in [0, 1)")


@dataclass
class TrainResult:
    module: TrainedDrafter | Eagle3Draft | MtpDraft | DFlashDraft
    log: list[dict[str, float]] = field(default_factory=list)
    eval: dict[str, Any] = field(default_factory=dict)


def split_sequences(features: Features, eval_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    seqs = sorted(set(features.seq.tolist()))
    rng = random.Random(seed)
    rng.shuffle(seqs)
    n_eval = int(round(len(seqs) * eval_fraction))
    held = torch.tensor(sorted(seqs[:n_eval]), dtype=torch.long)
    is_eval = torch.isin(features.seq, held) if n_eval else torch.zeros(len(features.seq), dtype=torch.bool)
    return ~is_eval, is_eval


def optimise(
    module: nn.Module,
    settings: TrainSettings,
    step_losses: Callable[[torch.Generator], list[torch.Tensor]],
    progress: Callable[[str], None] | None,
    snapshot: Callable[[int, nn.Module], None] | None = None,
) -> list[dict[str, Any]]:
    """AdamW with 20 warm-up steps and a cosine decay; each step minimises the sum of
    ``step_losses(gen)`` (one per head, or one); logs their means every ~5 % of the steps.
    After each step in ``settings.snapshots``, ``snapshot(step, module)`` sees the drafter so far
    (in eval mode), so one run gives the curve of acceptance against training positions."""
    opt = torch.optim.AdamW(module.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 20) * 0.5 * (1 + math.cos(math.pi * min(s, settings.steps) / settings.steps))
    )
    gen = torch.Generator().manual_seed(settings.seed)
    log: list[dict[str, Any]] = []
    every = max(1, settings.steps // 20)
    t0 = time.perf_counter()
    module.train()
    running: list[list[float]] = []
    for step in range(settings.steps):
        losses = step_losses(gen)
        loss = torch.stack(losses).sum()
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # untyped in torch's stubs
        opt.step()
        sched.step()
        running.append([float(x.detach()) for x in losses])
        if (step + 1) % every == 0 or step == 0 or step + 1 == settings.steps:
            mean = [sum(r[k] for r in running) / len(running) for k in range(len(losses))]
            entry = {
                "step": step + 1,
                "loss": sum(mean),
                "loss_per_head": mean,
                "lr": sched.get_last_lr()[0],
                "elapsed_s": round(time.perf_counter() - t0, 2),
            }
            log.append(entry)
            running = []
            if progress:
                progress(f"step {step + 1}/{settings.steps} loss {entry['loss']:.4f}")
        if snapshot is not None and step + 1 in settings.snapshots:
            module.eval()
            snapshot(step + 1, module)
            module.train()
    module.eval()
    return log


def settings_dict(settings: TrainSettings) -> dict[str, Any]:
    return asdict(settings)
