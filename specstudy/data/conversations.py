"""A conversation's next turn: the earlier turns, the target's answers to them, and the next user turn.

A multi-turn record (MT-bench's two turns, a list of user turns, a list of role/content messages)
is replayed turn by turn (:mod:`specstudy.run.conversation_cells`): turn k + 1 is sent with the user turns 1..k
and the answers to them as its history, rendered the way turn 1 was (the chat template when the
task uses one, else plain text), so a prefix cache and an n-gram drafter see what a deployment's
second turn sees.  The answers are the target's own (its AR baseline's greedy output), never the
dataset's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..config.task import TaskConfig, load_task_config
from .rendering import TaskRequest, encode_text, render_chat
from .task_sources import TaskDataError, task_rows


def is_conversation(request: Any) -> bool:
    """Whether a request has user turns after its own (a record that replays turn by turn)."""
    return bool(getattr(request, "later_turns", ()))


def turn_count(request: Any) -> int:
    """How many turns the request's conversation runs (1 for a single-turn request)."""
    return int(getattr(request, "turn", 1)) + len(getattr(request, "later_turns", ()))


def next_turn(request: TaskRequest, answer: str, tokenizer: Any = None) -> TaskRequest:
    """The request for the turn after ``request``'s, with ``answer`` (the target's answer to it) in its history.

    With a chat template the messages grow by (assistant, answer), (user, next turn) and, given a
    tokenizer, the prompt and ids are the template rendered over all of them; without one the prompt
    is the previous prompt, the answer and the next turn, joined by blank lines.
    """
    if not request.later_turns:
        raise ValueError(f"request {request.prompt_id!r} turn {request.turn} is the conversation's last")
    user, rest = request.later_turns[0], request.later_turns[1:]
    if request.messages is not None:
        msgs = (*request.messages, ("assistant", answer), ("user", user))
        if tokenizer is None:
            prompt, ids = user, None
        else:
            prompt = render_chat(tokenizer, msgs)
            ids = tuple(encode_text(tokenizer, prompt, special=False))
    else:
        msgs = None
        prompt = f"{request.prompt}{answer}\n\n{user}"
        ids = tuple(encode_text(tokenizer, prompt, special=True)) if tokenizer is not None else None
    return dataclasses.replace(
        request, prompt=prompt, messages=msgs, prompt_ids=ids, later_turns=rest, turn=request.turn + 1
    )


def answers_by_turn(records: Sequence[Any]) -> dict[tuple[str, int, int], str]:
    """(prompt id, repeat, turn) -> the output text of each finished request: the history a turn's
    successors are built from."""
    return {(r.prompt_id, r.repeat, r.turn): r.output_text for r in records if r.status == "ok"}


def turns_per_prompt(task: str | TaskConfig | None) -> int:
    """At most how many requests one prompt of a task makes (its conversations' turns), for sizing a
    study before it runs: the most turns a record has, capped by the task's ``turns``; 1 for anything
    that is not a multi-turn task file (or whose data is not here yet, when ``turns`` is "all").
    ``task``: the study's parsed config (None: it did not validate), or a name or file."""
    try:
        cfg = task if isinstance(task, TaskConfig) or task is None else load_task_config(task)
    except (ValueError, OSError):
        return 1
    if cfg is None:
        return 1
    if cfg.trace is not None or cfg.tiers is not None or cfg.max_turns == 1:
        return 1
    try:
        most = max((len(r.turns) for r in task_rows(cfg, cfg.sources, fetch=False)), default=1)
    except (TaskDataError, ValueError, OSError):
        return cfg.max_turns or 1
    return min(most, cfg.max_turns) if cfg.max_turns else most
