"""The streaming HTTP client of every server backend: SSE events and what a stream carried.

Servers stream ``text/event-stream`` bodies; :func:`iter_sse` yields their ``data:`` payloads
and :class:`StreamState` accumulates text, token ids, usage and the engine-specific blocks
(llama.cpp ``timings``, vLLM ``metrics``, SGLang ``meta_info``) that a backend reads afterwards.
"""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


class RequestFailed(Exception):
    """The server answered with an error (HTTP status or an error object in the stream)."""


class Deadline(Exception):
    """The request's wall-clock budget ran out."""


def iter_sse(resp: http.client.HTTPResponse) -> Iterator[str]:
    """The ``data:`` payloads of a ``text/event-stream`` body, one per event."""
    data: list[str] = []
    while True:
        raw = resp.readline()
        if not raw:
            break
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" "))
    if data:
        yield "\n".join(data)


@dataclass
class StreamState:
    """What a stream has carried so far (filled by :meth:`ServerBackend.consume`)."""

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
