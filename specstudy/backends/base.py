"""The one interface every engine implements: run requests of one cell, yield records.

The runner, the serving benchmark and the notebooks call only this, so the reference engine,
HF transformers, vLLM, SGLang and any OpenAI-compatible server share one code path and one set
of metrics.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from typing import Any

from ..frameworks import declaration
from ..frameworks.declaration import CellCheck
from ..records import Cell, Request, RequestRecord, Sampling
from .loadgen import Offer


def encode_request(tokenizer: Any, request: Request, chat: bool = False) -> list[int]:
    """Prompt token ids, the same for every in-process backend so frameworks see identical inputs:
    the request's own ids, else the chat template (when the request carries messages or ``chat``
    is set), else the plain text."""
    if request.prompt_ids is not None:
        return list(request.prompt_ids)
    if tokenizer is None:
        raise ValueError(f"request {request.prompt_id!r} has no prompt_ids and the backend has no tokenizer")
    if request.messages or chat:
        turns = request.messages or (("user", request.prompt),)
        msgs = [{"role": r, "content": c} for r, c in turns]
        out = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if hasattr(out, "keys") and "input_ids" in out:  # a BatchEncoding in newer transformers
            out = out["input_ids"]
        return [int(x) for x in out]
    return [int(x) for x in tokenizer(request.prompt)["input_ids"]]


class BackendUnavailable(RuntimeError):
    """An optional backend is not installed here; the message names the extra to install."""


class Backend(ABC):
    #: framework name written into every record ("reference", "hf", "vllm", "sglang", "openai")
    framework: str = ""
    #: methods this backend can run (names as in the study params)
    methods: tuple[str, ...] = ()

    @property
    def warms_itself(self) -> bool:
        """True when the engine runs its own warm-up at load, so the study sends it none."""
        return False

    @classmethod
    def check_cell(cls, cell: CellCheck) -> None:
        """Refuse, before any model loads, a cell this backend (at its pinned version) cannot run.

        ``cell.options`` are the cell's method options; ``cell.cuda`` says which build the study will
        use.  The default checks the cell against the engine's declaration (method, γ, drafter,
        option names, batch size); backends with more to check extend it.
        """
        cell.against(declaration(cls.framework))

    @abstractmethod
    def run(self, requests: Sequence[Request], sampling: Sampling, cell: Cell) -> Iterator[RequestRecord]:
        """Decode ``requests`` under ``cell`` (batching by ``cell.batch_size``), one record each.

        A failed request is a record with ``status`` oom/timeout/error, never an exception that
        loses the others.
        """

    def close(self) -> None:  # noqa: B027 (optional hook: in-process backends have nothing to release)
        """Release models, servers and memory."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ServingBackend(Backend):
    """A backend behind a server: requests can be offered one by one at a rate (serving sweeps).

    The runner's serving driver calls exactly these: :meth:`ensure_server` once per cell,
    :meth:`send` for untimed warm-up requests and :meth:`offer_run` for the timed run (the load
    generator's schedule, the server's counters scoped to the run, its memory and batch gauges).
    """

    @abstractmethod
    def ensure_server(self, cell: Cell) -> Any:
        """Start (or attach to) the server that runs ``cell``'s configuration."""

    @abstractmethod
    def send(self, request: Request, sampling: Sampling, cell: Cell, timeout_s: float | None = None) -> RequestRecord:
        """One request, one record; never raises for a server or network failure."""

    @abstractmethod
    def offer_run(self, run: Offer, *, gauges: bool = True) -> Any:
        """Offer ``run.requests[i]`` at ``run.offsets[i]`` s; a result with ``records``, ``wall_s``,
        ``run_acceptance`` and ``watch`` (see :class:`specstudy.backends.server_base.ServedBatch`).
        ``gauges``: sample the engine's batch gauges while the run lasts (request-rate runs)."""
