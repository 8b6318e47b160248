"""One streamed request of a server backend: made ready before its send time, sent, its SSE
stream read into a :class:`~specstudy.records.RequestRecord`.

:class:`StreamedRequests` is the part of :class:`~.server.StreamingServerBackend` that the load
generator (:mod:`.loadgen`) calls for every request, batch cells and request-rate cells alike:
:meth:`~StreamedRequests.prepare_send` before the run's clock starts (body, record, the request's
bytes), :meth:`~StreamedRequests.transmit` at the send time.  A failed or timed-out request is a
record with ``status`` set, never an exception.  What a chunk carries and how acceptance is read
are the backend's (:meth:`~StreamedRequests.consume`, :meth:`~StreamedRequests.fill_acceptance`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx

from ..records import Cell, Request, RequestRecord, Sampling
from .connections import Http, Wire, bounded
from .lifecycle import ServerInfo
from .sse import RequestFailed, StreamState, aiter_sse


@dataclass
class PreparedSend:
    """A request made ready to send: its record so far, the HTTP request (None: nothing to send)
    and its time budget."""

    request: Request
    record: RequestRecord
    http: Wire | None
    budget: float


class StreamedRequests:
    """The request exchange of a streaming server backend (mixed into
    :class:`~.server.StreamingServerBackend`, which sets these attributes and defines the
    methods below that raise)."""

    api_path: str
    api_key: str | None
    request_timeout_s: float
    idle_timeout_s: float
    server_info: ServerInfo | None

    @property
    def url(self) -> str | None:
        return self.server_info.url if self.server_info else None

    @property
    def effective_prefix_cache(self) -> bool | None:
        """The server's prefix caching as far as the kit knows: None (unknown) unless it set it."""
        return None

    def request_body(self, request: Request, sampling: Sampling) -> dict[str, Any]:
        raise NotImplementedError

    def consume(self, obj: dict[str, Any], st: StreamState) -> int:
        """Fold one streamed chunk into ``st``; return the output tokens it carried."""
        raise NotImplementedError

    def fill_acceptance(self, rec: RequestRecord, st: StreamState) -> None:
        """Per-request acceptance the server reported; None otherwise."""

    def encode_body(self, request: Request, sampling: Sampling) -> bytes:
        """The request body as sent (built before a run's clock starts: tokenizing is not sending)."""
        return json.dumps(self.request_body(request, sampling)).encode()

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def prepare_send(
        self,
        http: Http,
        request: Request,
        sampling: Sampling,
        cell: Cell,
        timeout_s: float | None = None,
        *,
        body: bytes | None = None,
    ) -> PreparedSend:
        """Everything a send needs, built before its scheduled time (the record, the HTTP request):
        the load generator calls this ahead, so the send itself is only the HTTP exchange."""
        budget = self.request_timeout_s if timeout_s is None else min(timeout_s, self.request_timeout_s)
        budget = max(budget, 1e-3)
        rec = cell.new_record(request, sampling, input_policy=getattr(request, "input_policy", "") or "")
        rec.extra["endpoint"] = self.api_path
        if self.url is None:
            rec.status, rec.error = "error", "no server: the backend has no server for this cell"
            return PreparedSend(request, rec, None, budget)
        if self.server_info is not None:
            rec.extra["server"] = self.server_info.as_dict()
        payload = body if body is not None else self.encode_body(request, sampling)
        req = http.build_request(
            "POST",
            self.url + self.api_path,
            content=payload,
            headers=self.headers(),
            read_s=min(self.idle_timeout_s, budget),
            connect_s=budget,
        )
        return PreparedSend(request, rec, req, budget)

    async def transmit(
        self,
        http: Http,
        prep: PreparedSend,
        cell: Cell,
        origin: float | None = None,
        budget_s: float | None = None,
    ) -> RequestRecord:
        """Send a prepared request and read its stream into its record; never raises for a server
        or network failure.  ``origin`` is the run's start (perf_counter) ``sent_s`` counts from;
        ``budget_s`` shortens the prepared budget (what the run deadline leaves now)."""
        rec, st = prep.record, StreamState()
        if prep.http is None:
            return rec
        budget = prep.budget if budget_s is None else min(prep.budget, budget_s)
        try:
            await bounded(self._stream(http, prep.http, rec, st, origin), budget)
        except asyncio.TimeoutError:
            rec.status, rec.error = "timeout", f"no complete answer within {budget:.1f} s"
        except httpx.ReadTimeout:
            rec.status, rec.error = "timeout", f"no data for {self.idle_timeout_s:.1f} s"
        except httpx.TimeoutException as e:
            rec.status, rec.error = "timeout", f"{type(e).__name__}: {e}"[:2000]
        except (httpx.HTTPError, OSError, ValueError, RequestFailed) as e:
            rec.status, rec.error = "error", f"{type(e).__name__}: {e}"[:2000]
        self._finish(rec, prep.request, st)
        self.after_send(rec, cell)
        return rec

    async def _stream(self, http: Http, req: Wire, rec: RequestRecord, st: StreamState, origin: float | None) -> None:
        """Send ``req`` and read its SSE stream into ``rec`` (times from the send) and ``st``."""
        t0 = time.perf_counter()  # the send: right before the HTTP exchange, nothing else in between
        rec.start_epoch = time.time()
        if origin is not None:
            rec.sent_s = t0 - origin
        resp = await http.send(req)
        try:
            if resp.status_code != 200:
                text = (await resp.aread())[:2000].decode("utf-8", "replace")
                raise RequestFailed(f"HTTP {resp.status_code}: {text}")
            async for data in aiter_sse(resp.aiter_lines()):
                if data.strip() == "[DONE]":
                    break
                obj = json.loads(data)
                if isinstance(obj, dict) and obj.get("error"):
                    raise RequestFailed(f"server error in stream: {obj['error']}")
                n = self.consume(obj, st)
                if n > 0:
                    t = time.perf_counter() - t0
                    if rec.first_token_s is None:
                        rec.first_token_s = t
                    rec.chunk_times_s.append(t)
                    rec.chunk_tokens.append(n)
            rec.end_s = time.perf_counter() - t0
        finally:
            await resp.aclose()

    def after_send(self, rec: RequestRecord, cell: Cell) -> None:
        """What a subclass adds to every record once its request is done (llama.cpp's provenance)."""

    def _finish(self, rec: RequestRecord, request: Request, st: StreamState) -> None:
        usage = st.usage or {}
        rec.output_tokens = int(usage.get("completion_tokens", st.tokens) or st.tokens)
        if usage.get("prompt_tokens") is not None:
            rec.input_tokens = int(usage["prompt_tokens"])
        elif request.prompt_ids is not None:
            rec.input_tokens = len(request.prompt_ids)
        rec.output_text = st.text
        rec.output_ids = list(st.output_ids)
        rec.extra["chunk_token_count"] = st.count_source or "none"
        if st.finish_reason:
            rec.extra["finish_reason"] = st.finish_reason
        rec.extra["engine_prefix_cache"] = self.effective_prefix_cache
        if rec.status == "ok" and rec.output_tokens == 0:
            rec.status, rec.error = "error", "stream ended without output tokens"
        self.fill_acceptance(rec, st)
