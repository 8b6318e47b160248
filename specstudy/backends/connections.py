"""The load generator's TCP connections, opened ahead of their requests.

Why: opening a connection is the client's work, and it sat inside every TTFT.  Measured here
against a local stub (``bench/send_schedule.py``): one connect through httpcore's anyio backend
takes 1.3 ms, 32 at once 15 ms, and the last request of a 32-request rate-inf burst was written
20–26 ms after the first send began.  So each connection is opened up to :data:`CONNECT_AHEAD_S`
before its request is due, at a moment the sender has nothing due (:class:`OpenAhead`), and at
its send time a request only writes.  A request with no connection ready (one that waited for a
slot of a closed loop) opens its own; one the server closed meanwhile is dropped and replaced.
Connections are not opened for requests waiting for a slot: their send time is unknown, and an
idle connection holds one of llama.cpp's HTTP threads (cpp-httplib, a thread per connection;
``max(n_parallel + 2, cores - 1)`` of them) for as long as it waits.

The streams are httpcore's own (its anyio backend); :class:`Connections` is httpcore's documented
network-backend interface.  Streams on asyncio's own transports were tried and were no faster: at
rate inf what stands between one request's write and the next is httpx's and httpcore's ~0.15–0.2
ms of Python per request, not the stream.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Sequence
from typing import Any, TypeVar

import httpcore
import httpx

#: a request's TCP connection is opened at most this long before its send time: a server may close
#: a connection that sits idle (uvicorn's and cpp-httplib's keep-alive timeouts are 5 s)
CONNECT_AHEAD_S = 1.0
#: after a send, connections are opened only when the next send is at least this far away, and at
#: most OPEN_PER_GAP of them (each connect is ~0.3-0.5 ms of the loop's time): opened right after
#: a send with the next one due 0.5 ms later, four connects delayed that send by 2 ms (measured)
QUIET_S = 0.005
OPEN_PER_GAP = 4

T = TypeVar("T")


async def bounded(aw: Awaitable[T], budget_s: float) -> T:
    """``aw`` within ``budget_s`` seconds (``asyncio.TimeoutError`` after), run in the calling
    task: Python 3.11's ``asyncio.timeout``, not ``wait_for``'s extra task, which put one more
    loop step before every send (and let connects opened right after a send go first)."""
    if hasattr(asyncio, "timeout"):
        async with asyncio.timeout(budget_s):
            return await aw
    return await asyncio.wait_for(aw, budget_s)  # Python 3.10


class Connections(httpcore.AsyncNetworkBackend):
    """httpcore's network backend for one run: hands a request a connection opened for it ahead
    of time (:meth:`open`), else opens one; counts which it did."""

    def __init__(self) -> None:
        self._net = httpcore.AnyIOBackend()
        self._ready: dict[tuple[str, int], deque[httpcore.AsyncNetworkStream]] = defaultdict(deque)
        self.preopened_used = 0
        self.opened_at_send = 0

    async def open(self, addr: tuple[str, int] | None, timeout_s: float = 10.0) -> None:
        """Open one connection to ``addr`` for a later request; a failure is left to the request
        (it connects itself and records the real error)."""
        if addr is None:
            return
        try:
            stream = await self._net.connect_tcp(addr[0], addr[1], timeout=timeout_s)
        except (httpcore.ConnectError, httpcore.ConnectTimeout):
            return
        self._ready[addr].append(stream)

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        ready = self._ready.get((host, port))
        while ready:
            stream = ready.popleft()
            if not stream.get_extra_info("is_readable"):  # readable while unused: the peer closed it
                self.preopened_used += 1
                return stream
            await stream.aclose()
        self.opened_at_send += 1
        return await self._net.connect_tcp(
            host, port, timeout=timeout, local_address=local_address, socket_options=socket_options
        )

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Any = None
    ) -> httpcore.AsyncNetworkStream:
        return await self._net.connect_unix_socket(path, timeout=timeout, socket_options=socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._net.sleep(seconds)

    async def aclose(self) -> None:
        """Close the connections no request used."""
        for ready in self._ready.values():
            while ready:
                await ready.popleft().aclose()


class _Transport(httpx.AsyncHTTPTransport):
    """httpx's transport over :class:`Connections`.  httpx 0.28 (pinned) takes no network backend,
    so its connection pool is rebuilt with one; a test checks that requests use it."""

    def __init__(self, connections: Connections):
        super().__init__(verify=False, trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            max_connections=None, max_keepalive_connections=0, network_backend=connections
        )


class Http:
    """One run's HTTP: a client that builds the requests, and the transport under it that sends
    them.  A send goes to the transport directly (httpx's public transport interface): the
    client's layers around it (auth, redirects, cookies, event hooks) do nothing for the kit's
    requests and cost 0.027 ms a send, measured here at rate inf (0.185 vs 0.158 ms between two
    sends of a burst, ``bench/send_schedule.py``).

    The client: no connection cap (rate inf opens one per request at once), a fresh connection per
    request (no keep-alive: llama.cpp's server closes a connection after a streamed response
    without saying so, and a request sent on it meanwhile fails with "Server disconnected"; 12 of
    166 requests in one default study), connections from :class:`Connections`, no proxy from the
    environment (the servers are local; a proxy would sit in every timing), and no certificate
    store (servers are plain http, ``split_url`` refuses https; loading the store costs 50 ms)."""

    def __init__(self) -> None:
        self.connections = Connections()
        self.transport = _Transport(self.connections)
        self.client = httpx.AsyncClient(transport=self.transport, trust_env=False)

    def build_request(self, method: str, url: str, **kwargs: Any) -> httpx.Request:
        return self.client.build_request(method, url, **kwargs)

    async def send(self, request: httpx.Request) -> httpx.Response:
        """The response with its body still to stream (close it with ``aclose``)."""
        return await self.transport.handle_async_request(request)

    async def aclose(self) -> None:
        await self.client.aclose()
        await self.connections.aclose()

    async def __aenter__(self) -> Http:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def address(prep: Any) -> tuple[str, int] | None:
    """The (host, port) a prepared send (its ``http`` request) goes to, as httpcore asks for it."""
    req = getattr(prep, "http", None)
    if not isinstance(req, httpx.Request) or req.url.scheme != "http":
        return None
    return req.url.host, req.url.port or 80


class OpenAhead:
    """Connections for the requests whose send time is known, each opened up to
    :data:`CONNECT_AHEAD_S` before it, at moments the sender has nothing due: before the clock
    starts, right after a send, or in a gap.  (Opened on a timer of their own, connects landed on
    other requests' send times: in one 3-repeat bench run the worst Poisson send lag went from 0.8
    to 1.6 ms.)"""

    def __init__(
        self,
        connections: Connections,
        addresses: Sequence[tuple[str, int] | None],
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
