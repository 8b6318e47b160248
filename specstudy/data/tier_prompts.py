"""Input-length tiers and a random-token control, built from any task's sources.

SPEED-Bench measures speculative throughput at fixed input lengths (~1k, 2k, 8k, 16k, 32k tokens)
because acceptance and the cost of a verification step both change with context length, and
reports that random-token inputs overstate speculative throughput (about 23 %).  A task with
``tiers: {input_tokens: [1024, 2048, 4096], random_control: true}`` gets, per tier, prompts of
exactly that many tokens of the target's tokenizer: the sources' first turns (in the task's seeded
order, starting one record further for each prompt) joined by blank lines and cut at the tier's
length; with ``random_control`` each real prompt has a twin of as many tokens drawn uniformly from
the vocabulary (special tokens excluded), seeded by the prompt id.  Tiered prompts are plain token
ids (no chat template: a template's own tokens would move the length off the tier).  Records say
which: ``input_policy`` ``tier:1024`` or ``tier:1024:random``.  The first n requests cover the tiers
evenly (tier by tier for each prompt, its random twin after it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..config.errors import ParamsError
from ..config.task import TaskConfig, TierSpec
from .rendering import TaskRequest, encode_text
from .task_sources import PromptRow


def tier_policy(tokens: int, random: bool = False) -> str:
    """The ``input_policy`` a tiered request's records carry."""
    return f"tier:{tokens}" + (":random" if random else "")


def parse_tier(policy: str) -> tuple[int, bool] | None:
    """``"tier:1024:random"`` → (1024, True); None for any other policy."""
    parts = str(policy or "").split(":")
    if len(parts) < 2 or parts[0] != "tier" or not parts[1].isdigit():
        return None
    return int(parts[1]), parts[-1] == "random"


def _joined_ids(tokenizer: Any, rows: Sequence[PromptRow], start: int, need: int) -> list[int]:
    """Token ids of the rows' first turns from ``start`` on (wrapping), joined by blank lines, until ``need``."""
    ids: list[int] = []
    sep = encode_text(tokenizer, "\n\n", special=False)
    for k in range(len(rows) * (1 + need)):  # a short corpus repeats; never loops forever
        if len(ids) >= need:
            return ids[:need]
        ids += (sep if ids else []) + encode_text(tokenizer, rows[(start + k) % len(rows)].turns[0], special=False)
    return ids[:need]


def random_ids(tokenizer: Any, n: int, key: str) -> list[int]:
    """``n`` token ids uniform over the vocabulary without special tokens, seeded by ``key``."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    vocab = np.asarray([i for i in range(len(tokenizer)) if i not in special])
    rng = np.random.default_rng(int(hashlib.sha256(key.encode()).hexdigest()[:16], 16))
    return [int(x) for x in rng.choice(vocab, size=n)]


def tier_capacity(spec: TierSpec, records: int) -> int:
    """How many distinct tiered prompts ``records`` source records make."""
    return records * len(spec.input_tokens) * (2 if spec.random_control else 1)


def tier_requests(
    cfg: TaskConfig, spec: TierSpec, rows: Sequence[PromptRow], want: int | None, tokenizer: Any
) -> list[TaskRequest]:
    """``want`` tiered requests (None: one per row and tier) from rows already in the task's seeded order."""
    if tokenizer is None:
        raise ParamsError(
            cfg.file,
            "tiers",
            {"input_tokens": list(spec.input_tokens)},
            "a target whose tokenizer is here (tiers count the target's tokens)",
            "the tokenizer comes with the model: fetch it first (`make tasks-data` for the GGUF) or drop tiers",
        )
    if not rows:
        raise ParamsError(cfg.file, "sources", [], "at least one record to build tiers from")
    out: list[TaskRequest] = []
    total = tier_capacity(spec, len(rows)) if want is None else want
    if total > tier_capacity(spec, len(rows)):
        raise ParamsError(
            cfg.file,
            "n",
            want,
            f"at most {tier_capacity(spec, len(rows))} ({len(rows)} records × {len(spec.input_tokens)} tiers"
            + (" × real and random)" if spec.random_control else ")"),
            "each record starts one prompt per tier, so no two prompts are the same",
        )
    per = 2 if spec.random_control else 1
    k = 0
    while len(out) < total:
        for tokens in spec.input_tokens:
            ids = _joined_ids(tokenizer, rows, k, tokens)
            pid = f"tier{tokens}:{rows[k % len(rows)].prompt_id}#{k}"
            variants = [(pid, ids, False)] + (
                [(f"{pid}:random", random_ids(tokenizer, tokens, pid), True)] if per == 2 else []
            )
            for prompt_id, pids, rnd in variants:
                out.append(
                    TaskRequest(
                        prompt_id=prompt_id,
                        prompt=tokenizer.decode(pids),
                        task=cfg.name,
                        prompt_ids=tuple(pids),
                        input_policy=tier_policy(tokens, rnd),
                        source="random" if rnd else rows[k % len(rows)].source,
                    )
                )
        k += 1
    return out[:total]
