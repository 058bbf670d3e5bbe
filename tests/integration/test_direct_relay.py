"""A replica's stream poured into the client's connection (``RelayStream`` with the
server's ``prefixgate.body_writer``) on the gateway's own HTTP server (uvicorn with
``GuardedHttpTools``) and the production backend, over real sockets: every byte in
order with valid chunked framing, a client that does not read holds the replica back
(not the gateway's memory), and a client that leaves closes the replica's connection.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import httpx
import uvicorn
from starlette.types import Receive, Scope, Send

from engine.backends.base import Timeouts
from engine.backends.remote import RemoteBackend
from gateway.config import ServerSettings
from gateway.request.streaming import BODY_WRITER, RelayEnd, RelayStream
from gateway.server.http import protocol_class
from tests.support.ports import free_port
from tests.support.scripted_http import (
    STREAM_END,
    STREAM_HEAD,
    Connection,
    LongStream,
    chunk,
    scripted_server,
)

GUARD = 10.0


class Relay:
    """An ASGI app that relays every request's stream from ``backend`` as the proxy does."""

    def __init__(self, backend: RemoteBackend) -> None:
        self.backend = backend
        self.ends: list[RelayEnd] = []
        self.had_writer: list[bool] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.had_writer.append(BODY_WRITER in scope.get("extensions", {}))
        upstream = await self.backend.send("/v1/chat/completions", b"{}", {})
        first = await anext(upstream.chunks)

        async def finish(end: RelayEnd) -> None:
            self.ends.append(end)
            await upstream.close()

        stream = RelayStream(upstream.chunks, upstream.status_code,
                             {"content-type": "text/event-stream"}, finish,
                             first=first, pour=upstream.pour)
        await stream(scope, receive, send)


@contextlib.asynccontextmanager
async def serving(app: Relay) -> AsyncIterator[str]:
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                            http=protocol_class(ServerSettings()), ws="none", lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.ensure_future(server.serve())
    try:
        async with asyncio.timeout(GUARD):
            while not server.started:
                await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, GUARD)


async def raw_request(url: str, extra_headers: bytes = b""
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A streamed request sent on a plain socket, which reads only when the test says."""
    reader, writer = await asyncio.open_connection("127.0.0.1", int(url.rsplit(":", 1)[1]))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-length: 2\r\n"
                 + extra_headers + b"\r\n{}")
    await writer.drain()
    return reader, writer


def dechunk(raw: bytes) -> bytes:
    """A chunked HTTP/1.1 body (after the head), checked as it is taken apart."""
    out: list[bytes] = []
    at = 0
    while True:
        end = raw.index(b"\r\n", at)
        size = int(raw[at:end], 16)
        at = end + 2
        if size == 0:
            assert raw[at:] == b"\r\n"
            return b"".join(out)
        out.append(raw[at:at + size])
        assert raw[at + size:at + size + 2] == b"\r\n"
        at += size + 2


async def test_a_stream_arrives_whole_in_order_and_the_connection_serves_the_next() -> None:
    events = [f"data: {index}\n\n".encode() for index in range(50)]

    async def script(connection: Connection) -> None:
        while await connection.read_request() is not None:
            await connection.send(STREAM_HEAD)
            for event in events:
                await connection.send(chunk(event))
            await connection.send(STREAM_END)

    async with scripted_server(script) as replica:
        app = Relay(RemoteBackend("r1", replica.url, Timeouts()))
        async with serving(app) as url, httpx.AsyncClient(base_url=url, timeout=GUARD) as client:
            for _ in range(2):
                async with client.stream("POST", "/v1/chat/completions", json={}) as response:
                    assert response.status_code == 200
                    assert response.headers["transfer-encoding"] == "chunked"
                    assert await response.aread() == b"".join(events)
    assert app.had_writer == [True, True]  # the server offered the writer both times
    assert [end.error for end in app.ends] == [None, None]
    assert len(replica.connections) == 1  # and the replica's connection was reused


async def test_a_client_that_does_not_read_holds_the_replica_back_then_gets_every_byte(
) -> None:
    stream = LongStream(768)  # 48 MiB: more than the sockets' buffers on the way hold

    async with scripted_server(stream) as replica:
        app = Relay(RemoteBackend("r1", replica.url, Timeouts()))
        async with serving(app) as url:
            reader, writer = await raw_request(url, b"connection: close\r\n")
            await asyncio.sleep(1.0)  # not reading
            held_at = stream.sent
            await asyncio.sleep(0.3)
            assert stream.sent == held_at < stream.pieces // 2
            async with asyncio.timeout(GUARD * 3):
                raw = await reader.read()
            writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert dechunk(body) == stream.body
    assert [end.error for end in app.ends] == [None]


async def test_a_client_that_leaves_mid_stream_closes_the_replicas_connection() -> None:
    closed = asyncio.get_running_loop().create_future()

    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(STREAM_HEAD + chunk(b"data: 0\n\n"))
        await asyncio.sleep(0.05)
        await connection.send(chunk(b"data: 1\n\n"))
        closed.set_result(await connection.closed_by_client())

    async with scripted_server(script) as replica:
        app = Relay(RemoteBackend("r1", replica.url, Timeouts()))
        async with serving(app) as url:
            reader, writer = await raw_request(url)
            async with asyncio.timeout(GUARD):
                assert b"data: 1" in await reader.readuntil(b"data: 1\n\n")
            writer.close()
            assert await asyncio.wait_for(closed, GUARD)
            async with asyncio.timeout(GUARD):
                while not app.ends:
                    await asyncio.sleep(0.01)
    assert app.ends[0].error is not None

