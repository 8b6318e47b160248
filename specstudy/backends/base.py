"""The one interface every engine implements: run requests of one cell, yield records.

The runner, the serving benchmark and the notebooks call only this, so the reference engine,
HF transformers, vLLM, SGLang and any OpenAI-compatible server share one code path and one set
of metrics.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Iterator, Sequence

from ..records import Cell, Request, RequestRecord, Sampling


class BackendUnavailable(RuntimeError):
    """An optional backend is not installed here; the message names the extra to install."""


class Backend(ABC):
    #: framework name written into every record ("reference", "hf", "vllm", "sglang", "openai")
    framework: str = ""
    #: methods this backend can run (names as in the study params)
    methods: tuple[str, ...] = ()

    @abstractmethod
    def run(self, requests: Sequence[Request], sampling: Sampling, cell: Cell) -> Iterator[RequestRecord]:
        """Decode ``requests`` under ``cell`` (batching by ``cell.batch_size``), one record each.

        A failed request is a record with ``status`` oom/timeout/error, never an exception that
        loses the others.
        """

    def close(self) -> None:
        """Release models, servers and memory."""

    def __enter__(self) -> "Backend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
