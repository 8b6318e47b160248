"""The streaming HTTP client of every server backend: SSE events and what a stream carried.

Servers stream ``text/event-stream`` bodies; :func:`aiter_sse` yields their ``data:`` payloads
and :class:`StreamState` accumulates text, token ids, usage and the engine-specific blocks
(llama.cpp ``timings``, vLLM ``metrics``, SGLang ``meta_info``) that a backend reads afterwards.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any


class RequestFailed(Exception):
    """The server answered with an error (HTTP status or an error object in the stream)."""


class SseDecoder:
    """``text/event-stream`` framing: lines in, one ``data:`` payload out per event.

    Pure (no I/O), so the asyncio client and the tests share it: a blank line ends an event,
    ``:`` lines are comments, several ``data:`` lines of one event are joined with newlines.
    """

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        """One line (with or without its line ending); the finished event's payload, if any."""
        line = line.rstrip("\r\n")
        if not line:
            return self.flush()
        if line.startswith("data:"):
            self._data.append(line[5:].lstrip(" "))
        return None

    def flush(self) -> str | None:
        """The pending event at the end of the stream (a server that omits the last blank line)."""
        if not self._data:
            return None
        out, self._data = "\n".join(self._data), []
        return out


async def aiter_sse(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The ``data:`` payloads of a streamed body given as its lines (``httpx.Response.aiter_lines``)."""
    decoder = SseDecoder()
    async for line in lines:
        event = decoder.feed(line)
        if event is not None:
            yield event
    last = decoder.flush()
    if last is not None:
        yield last


@dataclass
class StreamState:
    """What a stream has carried so far (filled by :meth:`StreamingServerBackend.consume`)."""

    text_parts: list[str] = field(default_factory=list)
    cumulative_text: str | None = None  # servers that resend the whole text each chunk
    output_ids: list[int] = field(default_factory=list)
    tokens: int = 0
    count_source: str = ""  # how chunk token counts were known: token_ids / usage / one_per_chunk
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None  # llama.cpp
    metrics: dict[str, Any] | None = None  # vLLM per-request metrics
    meta_info: dict[str, Any] | None = None  # SGLang
    finish_reason: str | None = None

    @property
    def text(self) -> str:
        return self.cumulative_text if self.cumulative_text is not None else "".join(self.text_parts)
