"""The load generator's connections: opened before their requests are due, one per request, and
replaced when the server closed one meanwhile."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from fake_servers import FakeServer

from specstudy.backends import connections
from specstudy.backends.connections import Connections, Http
from specstudy.backends.vllm_server import VllmServerBackend
from specstudy.records import Sampling

from .test_vllm_server import cell, reqs


class Counted(Connections):
    """Connections that remember every instance, so a test can read what a run did."""

    made: list[Counted] = []

    def __init__(self) -> None:
        super().__init__()
        Counted.made.append(self)


@pytest.fixture
def counted(monkeypatch):
    Counted.made = []
    monkeypatch.setattr(connections, "Connections", Counted)  # what every Http of a run or a send opens
    return Counted.made


def _run(backend, n, offsets, concurrency):
    c = dataclasses.replace(cell("ar", None, 1), batch_size=concurrency or 1)
    return backend.offer_run(
        reqs(n),
        Sampling(max_new_tokens=4),
        c,
        offsets,
        concurrency=concurrency,
        request_timeout_s=10,
        run_timeout_s=60,
        gauges=False,
    )


def test_requests_due_at_once_are_sent_on_connections_opened_before_the_clock(counted):
    with FakeServer(mode="vllm", spec=False, delay_s=0.001) as fake:
        b = VllmServerBackend("m", base_url=fake.url, request_timeout_s=10)
        burst = _run(b, 4, [0.0] * 4, None)
        closed = _run(b, 6, [0.0] * 6, 2)  # a closed loop of 2: only the first two sends have a known time
    assert all(r.status == "ok" for r in burst.records + closed.records)
    assert (counted[0].preopened_used, counted[0].opened_at_send) == (4, 0)
    assert (counted[1].preopened_used, counted[1].opened_at_send) == (2, 4)


def test_paced_requests_get_their_connection_shortly_before_they_are_due(counted, monkeypatch):
    monkeypatch.setattr(connections, "CONNECT_AHEAD_S", 0.05)
    with FakeServer(mode="vllm", spec=False, delay_s=0.001) as fake:
        b = VllmServerBackend("m", base_url=fake.url, request_timeout_s=10)
        run = _run(b, 3, [0.0, 0.2, 0.4], None)
        one = b.send(reqs(1)[0], Sampling(max_new_tokens=4), cell("ar", None, 1))  # a warm-up or probe send
    assert all(r.status == "ok" for r in run.records) and one.status == "ok"
    assert (counted[0].preopened_used, counted[0].opened_at_send) == (3, 0)
    assert (counted[1].preopened_used, counted[1].opened_at_send) == (1, 0)
    assert all(0 <= r.sent_s - r.scheduled_send_s < 0.05 for r in run.records)


def test_a_connection_the_server_closed_before_its_request_is_replaced():
    accepted = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal accepted
        accepted += 1
        if accepted == 1:  # the pre-opened one: closed by the server while it waits (a keep-alive timeout)
            writer.close()
            return
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def main() -> tuple[int, Connections]:
        srv = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = srv.sockets[0].getsockname()[1]
        http = Http()
        conns = http.connections
        try:
            await conns.open(("127.0.0.1", port))
            await asyncio.sleep(0.1)  # the server's close arrives
            resp = await http.send(http.build_request("GET", f"http://127.0.0.1:{port}/health"))
            await resp.aread()
            await resp.aclose()
            return resp.status_code, conns
        finally:
            await http.aclose()
            srv.close()
            await srv.wait_closed()

    status, conns = asyncio.run(main())
    assert status == 200 and accepted == 2
    assert (conns.preopened_used, conns.opened_at_send) == (0, 1)


def test_a_failed_open_is_left_to_the_request():
    async def main() -> Counted:
        conns = Counted()
        await conns.open(("127.0.0.1", 1))  # nothing listens: no error here, no connection kept
        await conns.open(None)  # a prepared send without a request (no server)
        return conns

    conns = asyncio.run(main())
    assert not any(conns._ready.values())


def test_connections_ahead_open_earliest_first_and_at_most_a_gaps_worth():
    from specstudy.backends.connections import OpenAhead

    class Recorded(Connections):
        def __init__(self) -> None:
            super().__init__()
            self.opened: list[tuple[str, int] | None] = []

        async def open(self, addr, timeout_s: float = 10.0) -> None:
            self.opened.append(addr)

    async def main() -> list:
        conns = Recorded()
        addrs = [("h", i) for i in range(6)]
        ahead = OpenAhead(conns, addrs, [0.5, 0.1, 0.3, 2.0, 0.2, 0.4], known=range(6))
        ahead.upto(1.0, limit=2)  # a short gap: the two due first
        await asyncio.gather(*ahead.tasks)
        first = list(conns.opened)
        assert ahead.pending(2) and not ahead.pending(1) and not ahead.pending(4)
        ahead.upto(1.0)  # the rest due within the window; request 3 (at 2.0 s) waits
        await asyncio.gather(*ahead.tasks)
        assert ahead.pending(3)
        await ahead.aclose()
        return [first, conns.opened]

    first, all_opened = asyncio.run(main())
    assert first == [("h", 1), ("h", 4)]
    assert all_opened == [("h", 1), ("h", 4), ("h", 2), ("h", 5), ("h", 0)]
