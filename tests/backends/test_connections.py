"""The load generator's connections: opened before their requests are due, one per request, and
replaced when the server closed one meanwhile."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest
from fake_servers import FakeServer

from specstudy.backends import connections
from specstudy.backends.connections import Connections, Http
from specstudy.backends.loadgen import Offer
from specstudy.backends.vllm.vllm_server import VllmServerBackend
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
    run = Offer(reqs(n), Sampling(max_new_tokens=4), c, offsets, concurrency, request_timeout_s=10, run_timeout_s=60)
    return backend.offer_run(run, gauges=False)


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
    # each send's lag is recorded and none went out early (its size: bench/send_schedule.py, target 1 ms)
    assert all(r.sent_s is not None and r.scheduled_send_s is not None for r in run.records)
    assert all(r.sent_s >= r.scheduled_send_s for r in run.records)


async def _until(done) -> None:
    """Wait on a state the code under test reads, not on the clock."""
    while not done():
        await asyncio.sleep(0.005)


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
            (stream,) = conns._ready[("127.0.0.1", port)]
            # until the server's close has reached the client (what `usable` reads), however long that takes
            await asyncio.wait_for(_until(lambda: stream.reader.at_eof()), 30)
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


async def _serve(handle):
    srv = await asyncio.start_server(handle, "127.0.0.1", 0)
    return srv, f"http://127.0.0.1:{srv.sockets[0].getsockname()[1]}"


def test_a_request_is_made_whole_ahead_and_refuses_what_it_cannot_send():
    http = Http()
    wire = http.build_request("POST", "http://127.0.0.1:8000/v1/completions?x=1", content=b"{}", headers={"A": "b"})
    assert wire.addr == ("127.0.0.1", 8000)
    assert wire.data == (
        b"POST /v1/completions?x=1 HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nContent-Length: 2\r\nA: b\r\n"
        b"Connection: close\r\n\r\n{}"
    )
    assert http.build_request("GET", "http://localhost/health").data.startswith(
        b"GET /health HTTP/1.1\r\nHost: localhost\r\n"
    )
    with pytest.raises(ValueError, match="'https://h/p'.*plain http"):
        http.build_request("GET", "https://h/p")


def test_a_send_on_a_connection_opened_ahead_writes_in_its_first_step():
    """No loop step between the send time and the write: the request is written before the
    sending task first yields (so 32 sends due at once are 32 writes back to back)."""
    got: list[bytes] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        got.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()

    async def main() -> tuple[list[int], int, int, bytes]:
        srv, url = await _serve(handle)
        async with Http() as http:
            wire = http.build_request("GET", url + "/x")
            await http.connections.open(wire.addr)
            written: list[int] = []
            stream = http.connections._ready[wire.addr][0]
            write = stream.writer.write
            stream.writer.write = lambda data: (written.append(len(data)), write(data))[1]  # type: ignore[method-assign]
            task = asyncio.create_task(http.send(wire))
            await asyncio.sleep(0)  # the task's first step, and no more
            first_step = list(written)
            resp = await task
            body = await resp.aread()
            await resp.aclose()
        srv.close()
        return first_step, len(wire.data), resp.status_code, body

    first_step, size, status, body = asyncio.run(main())
    assert first_step == [size]  # the whole request, in one write, before the task yielded
    assert (status, body) == (200, b"ok") and got and got[0].startswith(b"GET /x HTTP/1.1\r\n")


def test_a_chunked_stream_is_read_line_by_line_across_chunk_boundaries():
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for part in (b'data: {"a":', b" 1}\n\nda", b"ta: [DONE]\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        writer.close()

    async def main() -> list[str]:
        srv, url = await _serve(handle)
        async with Http() as http:
            resp = await http.send(http.build_request("POST", url + "/v1/completions", content=b"{}"))
            lines = [line async for line in resp.aiter_lines()]
            await resp.aclose()
        srv.close()
        return lines

    assert asyncio.run(main()) == ['data: {"a": 1}', "", "data: [DONE]", ""]


@pytest.mark.parametrize("fault", ["silent", "closes"])
def test_a_silent_or_vanishing_server_is_an_httpx_error_naming_it(fault):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        if fault == "silent":
            await asyncio.sleep(1.0)
        writer.close()

    async def main() -> Exception:
        srv, url = await _serve(handle)
        try:
            async with Http() as http:
                resp = await http.send(http.build_request("GET", url + "/s", read_s=0.2))
                with pytest.raises(httpx.TransportError) as err:
                    await resp.aread()
                await resp.aclose()
            return err.value
        finally:
            srv.close()

    err = asyncio.run(main())
    if fault == "silent":
        assert isinstance(err, httpx.ReadTimeout) and "no data for 0.2 s" in str(err)
    else:
        assert isinstance(err, httpx.RemoteProtocolError)


def test_nothing_listening_is_a_connect_error_naming_the_address():
    async def main() -> None:
        async with Http() as http:
            await http.send(http.build_request("GET", "http://127.0.0.1:1/x"))

    with pytest.raises(httpx.ConnectError, match="127.0.0.1:1"):
        asyncio.run(main())


def test_the_sender_warms_its_cpu_before_a_burst_only(monkeypatch):
    from specstudy.backends import loadgen

    assert loadgen.at_once([0.0] * 5, None) == 5
    assert loadgen.at_once([0.0] * 5, 2) == 2  # a closed loop of 2
    assert loadgen.at_once([0.0, 0.1, 0.3], None) == 1  # Poisson: the first at 0
    warmed: list[float] = []
    monkeypatch.setattr(loadgen, "warm_up", warmed.append)
    with FakeServer(mode="vllm", spec=False, delay_s=0.001) as fake:
        b = VllmServerBackend("m", base_url=fake.url, request_timeout_s=10)
        for offsets, concurrency in (([0.0, 0.05, 0.1], None), ([0.0] * 3, 1), ([0.0] * 3, None), ([0.0] * 4, 2)):
            assert all(r.status == "ok" for r in _run(b, len(offsets), offsets, concurrency).records)
    assert warmed == [loadgen.WARM_S, loadgen.WARM_S]  # rate inf and the closed loop of 2
