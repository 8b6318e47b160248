"""The load generator's HTTP: each request's bytes made ahead, written on a connection opened ahead.

Why: at rate inf a request's send is the time between two sends, and everything a client does
there delays the next request.  Measured here against a local stub (``bench/send_schedule.py``):

* opening the TCP connection: one connect through httpcore's anyio backend took 1.3 ms, 32 at
  once 15 ms, and the last request of a 32-request burst was written 20–26 ms after the first.
  So each connection is opened up to :data:`CONNECT_AHEAD_S` before its request is due, at a
  moment the sender has nothing due (:class:`OpenAhead`);
* building the request's bytes: httpx, httpcore and h11 build and check every request's headers
  at its send, 0.12 of the 0.17 ms a send took (32 sends written over 5.3–5.9 ms; the bytes built
  ahead and only written, over 1.3 ms).  So a request's bytes are made by h11 (httpx's own
  HTTP/1.1 library) when the request is prepared (:meth:`Http.build_request`), the same h11 state
  then reads its answer, and httpx's ``Response`` decodes the body (:meth:`Http.send`).

At its send time a request only writes: no step of the event loop comes between the send time and
the write.  A request with no connection ready (one that waited for a slot of a closed loop) opens
its own; one the server closed meanwhile is dropped and replaced.  Connections are not opened for
requests waiting for a slot: their send time is unknown, and an idle connection holds one of
llama.cpp's HTTP threads (cpp-httplib, a thread per connection; ``max(n_parallel + 2, cores - 1)``
of them) for as long as it waits.  One connection per request, closed after its answer
(``Connection: close``): llama.cpp's server closes a kept-alive connection after a streamed answer
without saying so, and a request sent on it meanwhile failed ("Server disconnected"; 12 of 166
requests in one default study).
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import h11
import httpx

#: a request's TCP connection is opened at most this long before its send time: a server may close
#: a connection that sits idle (uvicorn's and cpp-httplib's keep-alive timeouts are 5 s)
CONNECT_AHEAD_S = 1.0
#: after a send, connections are opened only when the next send is at least this far away, and at
#: most OPEN_PER_GAP of them (each connect is ~0.3-0.5 ms of the loop's time): opened right after
#: a send with the next one due 0.5 ms later, four connects delayed that send by 2 ms (measured)
QUIET_S = 0.005
OPEN_PER_GAP = 4
#: the most bytes one read of an answer takes
READ_BYTES = 65536

T = TypeVar("T")
Address = tuple[str, int]


async def bounded(aw: Awaitable[T], budget_s: float) -> T:
    """``aw`` within ``budget_s`` seconds (``asyncio.TimeoutError`` after), run in the calling
    task: Python 3.11's ``asyncio.timeout``, not ``wait_for``'s extra task, which put one more
    loop step before every send (and let connects opened right after a send go first)."""
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(budget_s):
            return await aw
    return await asyncio.wait_for(aw, budget_s)  # Python 3.10


@dataclass
class Stream:
    """One TCP connection (asyncio's streams)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    def usable(self) -> bool:
        """Still open at our end and not closed by the server (an end of stream it sent while
        the connection sat unused)."""
        return not (self.writer.is_closing() or self.reader.at_eof() or self.reader.exception())

    def close(self) -> None:
        self.writer.close()


async def connect(addr: Address, timeout_s: float) -> Stream:
    """A new connection to ``addr`` (asyncio sets TCP_NODELAY), as httpx's errors say it."""
    try:
        reader, writer = await bounded(asyncio.open_connection(addr[0], addr[1]), timeout_s)
    except asyncio.TimeoutError:
        raise httpx.ConnectTimeout(f"no connection to {addr[0]}:{addr[1]} within {timeout_s:g} s") from None
    except OSError as e:
        raise httpx.ConnectError(f"{addr[0]}:{addr[1]}: {e}") from e
    return Stream(reader, writer)


class Connections:
    """One run's connections: hands a request one opened for it ahead of time (:meth:`open`),
    else opens one; counts which it did."""

    def __init__(self) -> None:
        self._ready: dict[Address, deque[Stream]] = defaultdict(deque)
        self.preopened_used = 0
        self.opened_at_send = 0

    async def open(self, addr: Address | None, timeout_s: float = 10.0) -> None:
        """Open one connection to ``addr`` for a later request; a failure is left to the request
        (it connects itself and records the real error)."""
        if addr is None:
            return
        try:
            self._ready[addr].append(await connect(addr, timeout_s))
        except httpx.TransportError:
            return

    async def take(self, addr: Address, timeout_s: float) -> Stream:
        """A connection to ``addr`` for a request now: one opened ahead if a usable one is
        ready (no await, so no loop step, before the caller writes), else a new one."""
        ready = self._ready.get(addr)
        while ready:
            stream = ready.popleft()
            if stream.usable():
                self.preopened_used += 1
                return stream
            stream.close()
        self.opened_at_send += 1
        return await connect(addr, timeout_s)

    async def aclose(self) -> None:
        """Close the connections no request used."""
        for ready in self._ready.values():
            while ready:
                ready.popleft().close()


@dataclass
class Wire:
    """A request made ready to send: its bytes, made by h11 ahead of the send, and the h11
    state that reads its answer; ``read_s`` is the longest wait for the answer's next bytes."""

    addr: Address
    data: bytes
    state: h11.Connection
    read_s: float | None
    connect_s: float


async def next_event(wire: Wire, stream: Stream) -> Any:
    """The answer's next h11 event, reading from the connection as h11 needs; protocol errors,
    an early close and a silent server as httpx's errors."""
    while True:
        try:
            event = wire.state.next_event()
        except h11.RemoteProtocolError as e:
            raise httpx.RemoteProtocolError(str(e)) from e
        if isinstance(event, h11.ConnectionClosed):
            raise httpx.RemoteProtocolError("Server disconnected without sending a complete response")
        if event is not h11.NEED_DATA:
            return event
        read = stream.reader.read(READ_BYTES)
        try:
            data = await (read if wire.read_s is None else bounded(read, wire.read_s))
        except asyncio.TimeoutError:
            raise httpx.ReadTimeout(f"no data for {wire.read_s:g} s") from None
        except OSError as e:
            raise httpx.ReadError(f"{type(e).__name__}: {e}") from e
        wire.state.receive_data(data)  # b"": the server closed its end


class Body(httpx.AsyncByteStream):
    """An answer's body as httpx reads it (``aiter_lines``, ``aread``), from its h11 events;
    closing it closes the connection."""

    def __init__(self, wire: Wire, stream: Stream):
        self._wire, self._stream = wire, stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            event = await next_event(self._wire, self._stream)
            if isinstance(event, h11.EndOfMessage):
                return
            if isinstance(event, h11.Data):
                yield bytes(event.data)

    async def aclose(self) -> None:
        self._stream.close()


class Http:
    """One run's HTTP: requests made ready ahead (:meth:`build_request`), each sent on a
    connection from :class:`Connections` (:meth:`send`) and answered as an ``httpx.Response``.
    Plain http only (``split_url`` refuses https), no proxy (the servers are local; a proxy would
    sit in every timing), no content encoding asked for (none to decode inside a timing)."""

    def __init__(self) -> None:
        self.connections = Connections()

    def build_request(
        self,
        method: str,
        url: str,
        *,
        content: bytes = b"",
        headers: Mapping[str, str] | None = None,
        read_s: float | None = None,
        connect_s: float = 10.0,
    ) -> Wire:
        """The request's bytes and the h11 state for its answer, made now."""
        u = httpx.URL(url)
        if u.scheme != "http" or not u.host:
            raise ValueError(f"url {url!r}: the load generator sends plain http://host[:port]/path only")
        port = u.port or 80
        state = h11.Connection(h11.CLIENT)
        length = [("Content-Length", str(len(content)))] if content or method not in ("GET", "HEAD") else []
        head: list[tuple[str, str]] = [
            ("Host", u.netloc.decode("ascii")),
            *length,
            *(headers or {}).items(),
            ("Connection", "close"),
        ]
        data = state.send(h11.Request(method=method, target=u.raw_path, headers=head)) or b""
        if content:
            data += state.send(h11.Data(data=content)) or b""
        data += state.send(h11.EndOfMessage()) or b""
        return Wire((u.host, port), data, state, read_s, connect_s)

    async def send(self, wire: Wire) -> httpx.Response:
        """Write the request and read its answer's head; the body is still to stream (close the
        response with ``aclose``)."""
        stream = await self.connections.take(wire.addr, wire.connect_s)
        try:
            stream.writer.write(wire.data)
            await stream.writer.drain()  # waits only when the socket's buffer is full (a long prompt)
            event = await next_event(wire, stream)
            while isinstance(event, h11.InformationalResponse):  # 100 Continue
                event = await next_event(wire, stream)
        except BaseException:
            stream.close()
            raise
        return httpx.Response(event.status_code, headers=list(event.headers), stream=Body(wire, stream))

    async def aclose(self) -> None:
        await self.connections.aclose()

    async def __aenter__(self) -> Http:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def address(prep: Any) -> Address | None:
    """The (host, port) a prepared send (its ``http`` request) goes to."""
    wire = getattr(prep, "http", None)
    return wire.addr if isinstance(wire, Wire) else None


class OpenAhead:
    """Connections for the requests whose send time is known, each opened up to
    :data:`CONNECT_AHEAD_S` before it, at moments the sender has nothing due: before the clock
    starts, right after a send, or in a gap.  (Opened on a timer of their own, connects landed on
    other requests' send times: in one 3-repeat bench run the worst Poisson send lag went from 0.8
    to 1.6 ms.)"""

    def __init__(
        self,
        connections: Connections,
        addresses: Sequence[Address | None],
        offsets: Sequence[float],
        known: Sequence[int],
    ):
        self._connections, self._addresses, self._offsets = connections, addresses, offsets
        self._due = deque(sorted(known, key=lambda i: offsets[i]))
        self._pending = set(known)
        self.tasks: list[asyncio.Task[None]] = []

    def pending(self, i: int) -> bool:
        """Is request ``i``'s connection still to be opened?"""
        return i in self._pending

    async def before_clock(self) -> None:
        """Open (and wait for) the connections of the requests due within the first
        :data:`CONNECT_AHEAD_S`: at rate inf, every one."""
        self.upto(CONNECT_AHEAD_S)
        await asyncio.gather(*self.tasks)

    async def before_send(self, i: int, arrival: float) -> None:
        """Request ``i``, due at the perf_counter time ``arrival``, still has no connection (a
        gap of more than :data:`CONNECT_AHEAD_S` before it): open it, and those due soon after,
        that long ahead."""
        if not self.pending(i):
            return
        await asyncio.sleep(max(0.0, arrival - CONNECT_AHEAD_S - time.perf_counter()))
        self.upto(self._offsets[i] + CONNECT_AHEAD_S)

    def after_send(self, now: float, next_due: float) -> None:
        """A send went out at ``now`` (run seconds) and the next is due at ``next_due``: in a gap
        of at least :data:`QUIET_S`, open up to :data:`OPEN_PER_GAP` connections due within
        :data:`CONNECT_AHEAD_S` (they run after the send's first step)."""
        if next_due - now > QUIET_S:
            self.upto(now + CONNECT_AHEAD_S, OPEN_PER_GAP)

    def upto(self, offset: float, limit: int | None = None) -> None:
        """Start opening the connections of the requests due by ``offset`` (run seconds), the
        earliest first, at most ``limit`` of them."""
        while self._due and self._offsets[self._due[0]] <= offset and (limit is None or limit > 0):
            limit = None if limit is None else limit - 1
            j = self._due.popleft()
            self._pending.discard(j)
            self.tasks.append(asyncio.create_task(self._connections.open(self._addresses[j])))

    async def aclose(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
