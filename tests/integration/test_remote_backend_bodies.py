"""The production backend's response bodies over real sockets: streams relayed
chunk by chunk, the idle timeout between chunks, and a replica that goes away
half-way through a body.
"""

from __future__ import annotations

import asyncio

import pytest

from engine.backends.base import UpstreamResponse
from engine.errors import ReplicaStreamBroken, ReplicaTimeout
from tests.support.scripted_http import (
    STREAM_END,
    STREAM_HEAD,
    Connection,
    chunk,
    response,
    scripted_server,
)

from .conftest import MakeBackend

PATH = "/v1/chat/completions"
GUARD = 5.0
"""The tests' own limit on any wait, so a regression fails instead of hanging."""

EVENTS = [f"data: {index}\n\n".encode() for index in range(3)]


async def receive(upstream: UpstreamResponse, into: list[bytes]) -> None:
    async with asyncio.timeout(GUARD):
        async for data in upstream.chunks:
            into.append(data)


# --- streams ---------------------------------------------------------------------------

async def test_a_whole_stream_arrives_and_its_connection_serves_the_next_request(
        remote_backend: MakeBackend) -> None:
    async def script(connection: Connection) -> None:
        while await connection.read_request() is not None:
            await connection.send(STREAM_HEAD)
            for event in EVENTS:
                await connection.send(chunk(event))
            await connection.send(STREAM_END)

    async with scripted_server(script) as server:
        backend = remote_backend(server.url)
        for _ in range(2):
            upstream = await backend.send(PATH, b"{}", {})
            assert upstream.headers["content-type"] == "text/event-stream"
            received: list[bytes] = []
            await receive(upstream, received)
            await upstream.close()
            assert b"".join(received) == b"".join(EVENTS)
    assert len(server.connections) == 1


async def test_a_stream_given_up_half_way_closes_its_connection(
        remote_backend: MakeBackend) -> None:
    # Closing the connection is how vLLM learns to abort the generation.
    closed = asyncio.get_running_loop().create_future()

    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(STREAM_HEAD + chunk(EVENTS[0]))
        closed.set_result(await connection.closed_by_client())

    async with scripted_server(script) as server:
        upstream = await remote_backend(server.url).send(PATH, b"{}", {})
        async for data in upstream.chunks:
            assert data == EVENTS[0]
            break
        await upstream.close()
        assert await asyncio.wait_for(closed, GUARD)


async def test_a_stalled_stream_times_out_after_the_idle_limit(
        remote_backend: MakeBackend) -> None:
    closed = asyncio.get_running_loop().create_future()

    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(STREAM_HEAD + chunk(EVENTS[0]) + chunk(EVENTS[1]))
        closed.set_result(await connection.closed_by_client())  # then nothing, ever

    async with scripted_server(script) as server:
        upstream = await remote_backend(server.url, idle=0.3).send(PATH, b"{}", {})
        received: list[bytes] = []
        with pytest.raises(ReplicaTimeout, match="idle"):
            await receive(upstream, received)
        assert b"".join(received) == EVENTS[0] + EVENTS[1]
        await upstream.close()
        assert await asyncio.wait_for(closed, GUARD)


async def test_a_slow_but_steady_stream_is_not_cut(remote_backend: MakeBackend) -> None:
    # 8 chunks 0.1 s apart: longer in all than the idle limit, never idle that long
    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(STREAM_HEAD)
        for index in range(8):
            await connection.send(chunk(f"data: {index}\n\n".encode()))
            await asyncio.sleep(0.1)  # the replica's pace: what is under test
        await connection.send(STREAM_END)

    async with scripted_server(script) as server:
        upstream = await remote_backend(server.url, idle=0.4).send(PATH, b"{}", {})
        received: list[bytes] = []
        await receive(upstream, received)
        assert b"".join(received).count(b"data: ") == 8


@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_stream_cut_off_by_the_replica_is_broken_after_what_arrived(
        how: str, remote_backend: MakeBackend) -> None:
    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(STREAM_HEAD + chunk(EVENTS[0]) + chunk(EVENTS[1]))
        await (connection.close() if how == "close" else connection.reset())

    async with scripted_server(script) as server:
        upstream = await remote_backend(server.url).send(PATH, b"{}", {})
        received: list[bytes] = []
        with pytest.raises(ReplicaStreamBroken):
            await receive(upstream, received)
        await upstream.close()
    arrived, sent = b"".join(received), EVENTS[0] + EVENTS[1]
    if how == "close":
        assert arrived == sent
    else:  # a reset may discard what the kernel had not yet handed over
        assert sent.startswith(arrived)


# --- whole (non-streaming) bodies ------------------------------------------------------

@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_body_cut_short_of_its_length_is_broken(
        how: str, remote_backend: MakeBackend) -> None:
    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(response(200, b'{"choices": [', content_length=100))
        await (connection.close() if how == "close" else connection.reset())

    async with scripted_server(script) as server:
        upstream = await remote_backend(server.url).send(PATH, b"{}", {})
        assert upstream.status_code == 200
        with pytest.raises(ReplicaStreamBroken):
            await asyncio.wait_for(upstream.read(), GUARD)


async def test_a_body_that_stops_arriving_times_out_after_the_idle_limit(
        remote_backend: MakeBackend) -> None:
    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(response(200, b'{"choices": [', content_length=100))
        await connection.closed_by_client()

    async with scripted_server(script) as server:
        upstream = await remote_backend(server.url, idle=0.3).send(PATH, b"{}", {})
        with pytest.raises(ReplicaTimeout, match="idle"):
            await asyncio.wait_for(upstream.read(), GUARD)
