"""The production backend (aiohttp) against real sockets: what reaches the replica
and comes back, keep-alive and the resend on a stale connection, and the
connect and first-byte timeouts.

The replicas are scripted raw servers (``tests.support.scripted_http``) so
each edge case happens on purpose, not by timing luck. Stream bodies, idle
timeouts and connections cut mid-body are in ``test_remote_backend_bodies``.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Iterator

import pytest
from aiohttp import web

from engine.errors import ReplicaTimeout, ReplicaUnavailable
from tests.support.ports import free_port
from tests.support.scripted_http import Connection, response, scripted_server

from .conftest import MakeBackend

PATH = "/v1/chat/completions"
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
GUARD = 5.0
"""The tests' own limit on any wait, so a regression fails instead of hanging."""


async def answer_every_request(connection: Connection) -> None:
    """Keep the connection alive and answer each request with its connection's index."""
    while await connection.read_request() is not None:
        await connection.send(response(200, f'{{"connection": {connection.index}}}'.encode()))


# --- what goes out and what comes back -------------------------------------------------

async def test_the_replica_gets_the_body_and_the_clients_headers_less_hop_by_hop_ones(
        remote_backend: MakeBackend) -> None:
    async with scripted_server(answer_every_request) as server:
        upstream = await remote_backend(server.url, api_key="k3y").send(PATH, BODY, {
            "x-request-id": "abc", "Connection": "close", "Content-Length": "999",
            "host": "client.example", "content-type": "text/plain"})
        await upstream.read()
    (seen,) = server.seen
    assert (seen.method, seen.path, seen.body) == ("POST", PATH, BODY)
    assert seen.headers["x-request-id"] == "abc"
    assert seen.headers["authorization"] == "Bearer k3y"
    assert seen.headers["content-type"] == "text/plain"  # the caller's: a form keeps its own
    assert seen.headers["content-length"] == str(len(BODY))
    assert seen.headers["host"] == server.url.removeprefix("http://")
    assert seen.headers.get("connection") != "close"


@pytest.mark.parametrize("status", [200, 400, 429, 500, 503])
async def test_status_headers_and_body_come_back_unchanged(
        status: int, remote_backend: MakeBackend) -> None:
    body = json.dumps({"error": {"message": "scripted", "code": status}}).encode()

    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(response(status, body, {
            "Content-Type": "application/json", "Retry-After": "7",
            "Content-Encoding": "identity"}))

    async with scripted_server(script) as server:
        upstream = await remote_backend(server.url).send(PATH, BODY, {})
        assert upstream.status_code == status
        assert upstream.headers["content-type"] == "application/json"
        assert upstream.headers["retry-after"] == "7"
        assert await upstream.read() == body


async def test_a_get_returns_status_and_body_with_the_api_key(
        remote_backend: MakeBackend) -> None:
    async def handler(request: web.Request) -> web.Response:
        if request.headers.get("authorization") != "Bearer k3y":
            return web.Response(status=401)
        return web.Response(status=200, body=b'{"data": []}')

    app = web.Application()
    app.router.add_get("/v1/models", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        backend = remote_backend(f"http://127.0.0.1:{port}/", api_key="k3y")
        assert await backend.get("/v1/models") == (200, b'{"data": []}')
        assert (await backend.get("/nowhere"))[0] == 404
    finally:
        await runner.cleanup()


# --- keep-alive and the resend on a stale connection -----------------------------------

async def test_a_body_read_to_its_end_leaves_the_connection_for_the_next_request(
        remote_backend: MakeBackend) -> None:
    async with scripted_server(answer_every_request) as server:
        backend = remote_backend(server.url)
        bodies = [await (await backend.send(PATH, BODY, {})).read() for _ in range(3)]
    assert bodies == [b'{"connection": 0}'] * 3
    assert len(server.connections) == 1


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_request_on_a_connection_the_replica_closed_is_sent_again_on_a_fresh_one(
        how: str, remote_backend: MakeBackend) -> None:
    # The first connection answers once and is kept alive; the replica then
    # closes it as the next request arrives (its keep-alive timer won the race).
    async def script(connection: Connection) -> None:
        if connection.index > 0:
            await answer_every_request(connection)
            return
        await connection.read_request()
        await connection.send(response(200, b'{"first": true}'))
        await connection.reader.readuntil(b"\r\n\r\n")  # the next request's head, unanswered
        await (connection.close() if how == "close" else connection.reset())

    async with scripted_server(script) as server:
        backend = remote_backend(server.url)
        assert await (await backend.send(PATH, BODY, {})).read() == b'{"first": true}'
        second = await backend.send(PATH, BODY, {"x-request-id": "two"})
        assert second.status_code == 200
        assert await second.read() == b'{"connection": 1}'
    assert [seen.connection for seen in server.seen] == [0, 1]
    assert server.seen[1].body == BODY
    assert server.seen[1].headers["x-request-id"] == "two"


async def test_the_resend_goes_out_on_a_new_connection_even_when_more_stale_ones_are_pooled(
        remote_backend: MakeBackend) -> None:
    # Two concurrent requests leave two kept-alive connections in the pool;
    # the replica then closes every one of them as the next request arrives.
    both_arrived = asyncio.Event()
    arrived = 0

    async def script(connection: Connection) -> None:
        nonlocal arrived
        if connection.index >= 2:
            await answer_every_request(connection)
            return
        await connection.read_request()
        arrived += 1
        if arrived == 2:
            both_arrived.set()
        await both_arrived.wait()  # hold both open so that the second needs its own
        await connection.send(response(200, b"{}"))
        await connection.reader.readuntil(b"\r\n\r\n")
        await connection.close()

    async with scripted_server(script) as server:
        backend = remote_backend(server.url)
        first = await asyncio.gather(*(backend.send(PATH, BODY, {}) for _ in range(2)))
        for upstream in first:
            await upstream.read()
        upstream = await asyncio.wait_for(backend.send(PATH, BODY, {}), GUARD)
        assert await upstream.read() == b'{"connection": 2}'
    assert server.seen[-1].connection == 2


async def test_a_replica_that_drops_every_request_is_unavailable_after_one_resend(
        remote_backend: MakeBackend) -> None:
    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.close()

    async with scripted_server(script) as server:
        with pytest.raises(ReplicaUnavailable, match="ServerDisconnected"):
            await asyncio.wait_for(remote_backend(server.url).send(PATH, BODY, {}), GUARD)
    assert len(server.seen) == 2


# --- connect and first-byte timeouts ---------------------------------------------------

async def test_nothing_listening_is_unavailable(remote_backend: MakeBackend) -> None:
    backend = remote_backend(f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ReplicaUnavailable, match="cannot connect"):
        await asyncio.wait_for(backend.send(PATH, BODY, {}), GUARD)
    with pytest.raises(ReplicaUnavailable):
        await asyncio.wait_for(backend.get("/health"), GUARD)


@pytest.fixture
def unaccepting_port() -> Iterator[int]:
    """A port whose listener never accepts and whose backlog is full: a connect hangs."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port))  # takes the one queue slot
    try:
        yield port
    finally:
        filler.close()
        listener.close()


async def test_a_connect_that_hangs_is_unavailable_after_the_connect_timeout(
        unaccepting_port: int, remote_backend: MakeBackend) -> None:
    # Nothing was sent: the gateway may try another replica, and the error
    # says it was the connection, not the replica's answer, that timed out.
    backend = remote_backend(f"http://127.0.0.1:{unaccepting_port}",
                     connect=0.2, response=GUARD * 2)
    with pytest.raises(ReplicaUnavailable, match="connect"):
        await asyncio.wait_for(backend.send(PATH, BODY, {}), GUARD)


async def test_no_status_line_in_time_is_a_timeout_and_the_request_is_abandoned(
        remote_backend: MakeBackend) -> None:
    abandoned = asyncio.get_running_loop().create_future()

    async def script(connection: Connection) -> None:
        await connection.read_request()
        abandoned.set_result(await connection.closed_by_client())

    async with scripted_server(script) as server:
        backend = remote_backend(server.url, response=0.3)
        with pytest.raises(ReplicaTimeout, match="response timeout"):
            await asyncio.wait_for(backend.send(PATH, BODY, {}), GUARD)
        # closing the connection is how vLLM learns to abort the request
        assert await asyncio.wait_for(abandoned, GUARD)
    assert len(server.seen) == 1  # a timeout is not resent


# --- host names ----------------------------------------------------------------------

@pytest.fixture
async def lookups(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The host names the running loop is asked to resolve."""
    loop = asyncio.get_running_loop()
    asked: list[str] = []
    resolve = loop.getaddrinfo

    async def counted(host: str, *args: object, **kwargs: object) -> object:
        asked.append(host)
        return await resolve(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(loop, "getaddrinfo", counted)
    return asked


async def test_a_burst_of_new_connections_to_a_named_replica_looks_it_up_once(
        remote_backend: MakeBackend, lookups: list[str]) -> None:
    # "localhost" may name ::1 first, where nothing listens: the next address is tried.
    release = asyncio.Event()

    async def script(connection: Connection) -> None:
        await connection.read_request()
        await release.wait()  # every request holds its connection: 8 connections
        await connection.send(response(200, b"{}"))

    async with scripted_server(script) as server:
        backend = remote_backend(server.url.replace("127.0.0.1", "localhost"))
        sends = [asyncio.ensure_future(backend.send(PATH, BODY, {})) for _ in range(8)]
        async with asyncio.timeout(GUARD):
            while len(server.seen) < 8:
                await asyncio.sleep(0.01)
        release.set()
        for upstream in await asyncio.gather(*sends):
            assert await upstream.read() == b"{}"
    assert len(server.connections) == 8
    assert lookups == ["localhost"]


async def test_a_replica_that_cannot_be_reached_is_looked_up_again(
        remote_backend: MakeBackend, lookups: list[str]) -> None:
    backend = remote_backend(f"http://localhost:{free_port()}")
    for _ in range(2):
        with pytest.raises(ReplicaUnavailable, match="cannot connect"):
            await asyncio.wait_for(backend.send(PATH, BODY, {}), GUARD)
    assert lookups == ["localhost", "localhost"]
