"""The request a task yields, and the tokenizer calls that render its prompt (shared by the task
loader, conversations, traces and tiers)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..records import Request


@dataclass(frozen=True)
class TaskRequest(Request):
    """A :class:`Request` plus what the runner writes into records."""

    input_policy: str = "none"
    source: str = ""
    reference: str | None = None
    truncated: bool = False
    #: the conversation's user turns after this request's (replayed by :mod:`specstudy.run.conversation_cells`)
    later_turns: tuple[str, ...] = ()
    #: which turn this request is (1: the first); ``prompt``/``messages`` hold the history before it
    turn: int = 1


def encode_text(tokenizer: Any, text: str, special: bool) -> list[int]:
    return list(tokenizer(text, add_special_tokens=special)["input_ids"])


def render_chat(tokenizer: Any, messages: Sequence[tuple[str, str]]) -> str:
    text: str = tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in messages], tokenize=False, add_generation_prompt=True
    )
    return text
