"""The production backend's response bodies over real sockets: streams relayed
chunk by chunk, the idle timeout between chunks, and a replica that goes away
half-way through a body.
"""

from __future__ import annotations

import asyncio

import pytest

from engine.backends.base import UpstreamResponse
from engine.backends.remote import RemoteBackend
from engine.errors import ReplicaStreamBroken, ReplicaTimeout
from tests.support.scripted_http import (
    STREAM_END,
    STREAM_HEAD,
    Connection,
    LongStream,
    Script,
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


def events_then_silence(n: int, closed: asyncio.Future[bool]) -> Script:
    """A replica that answers a stream's head and its first ``n`` events, then sends
    nothing more; ``closed`` is set once the client closes the connection."""
    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(STREAM_HEAD + b"".join(chunk(event) for event in EVENTS[:n]))
        closed.set_result(await connection.closed_by_client())
    return script


class Writer:
    """A client's connection as ``pour`` sees it: takes chunks, full while ``blocked``
    (from the first chunk that takes it past ``block_after`` bytes on)."""

    def __init__(self, block_after: int | None = None) -> None:
        self.received: list[bytes] = []
        self.size = 0
        self.block_after = block_after
        self.blocked = False
        self.room = asyncio.Event()
        self.room.set()

    def write(self, data: bytes) -> bool:
        self.received.append(data)
        self.size += len(data)
        if self.block_after is not None and self.size > self.block_after:
            self.block_after = None
            self.block()
        return not self.blocked

    async def drain(self) -> None:
        await self.room.wait()

    def block(self) -> None:
        self.blocked = True
        self.room.clear()

    def unblock(self) -> None:
        self.blocked = False
        self.room.set()

    @property
    def bytes(self) -> bytes:
        return b"".join(self.received)


async def take(upstream: UpstreamResponse, into: list[bytes], poured: bool) -> None:
    """The whole body into ``into``: chunk by chunk, or (``poured``) the first chunk read
    and the rest poured, as the relay takes a stream."""
    if not poured:
        await receive(upstream, into)
        return
    into.append(await anext(upstream.chunks))
    writer = Writer()
    writer.received = into
    await pour(upstream, writer)


async def stream_twice(backend: RemoteBackend, poured: bool) -> list[tuple[str, bytes]]:
    """Two streamed requests one after the other: each answer's content type and body."""
    answers = []
    for _ in range(2):
        upstream = await backend.send(PATH, b"{}", {})
        received: list[bytes] = []
        await take(upstream, received, poured)
        await upstream.close()
        answers.append((upstream.headers.get("content-type", ""), b"".join(received)))
    return answers


async def pour(upstream: UpstreamResponse, writer: Writer) -> None:
    assert upstream.pour is not None
    async with asyncio.timeout(GUARD):
        await upstream.pour(writer.write, writer.drain)


# --- streams (read chunk by chunk, or poured: each chunk handed to a writer as it is parsed)

@pytest.mark.parametrize("poured", [False, True])
async def test_a_whole_stream_arrives_and_its_connection_serves_the_next_request(
        poured: bool, remote_backend: MakeBackend) -> None:
    async def script(connection: Connection) -> None:
        while await connection.read_request() is not None:
            await connection.send(STREAM_HEAD)
            for event in EVENTS:
                await connection.send(chunk(event))
                await asyncio.sleep(0.01)
            await connection.send(STREAM_END)

    async with scripted_server(script) as server:
        answers = await stream_twice(remote_backend(server.url), poured)
    assert answers == [("text/event-stream", b"".join(EVENTS))] * 2
    assert len(server.connections) == 1


@pytest.mark.parametrize("poured", [False, True])
async def test_a_stream_without_length_or_chunks_ends_where_its_connection_does(
        poured: bool, remote_backend: MakeBackend) -> None:
    # HTTP/1.1 allows it (a proxy in front of vLLM may answer so): the body is
    # whatever comes until the close, and that connection is not used again.
    async def script(connection: Connection) -> None:
        while await connection.read_request() is not None:
            await connection.send(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                                  b"connection: close\r\n\r\n")
            for event in EVENTS:
                await connection.send(event)
                await asyncio.sleep(0.01)
            await connection.close()
            return

    async with scripted_server(script) as server:
        answers = await stream_twice(remote_backend(server.url), poured)
    assert answers == [("text/event-stream", b"".join(EVENTS))] * 2
    assert len(server.connections) == 2


@pytest.mark.parametrize("poured", [False, True])
async def test_a_stream_given_up_half_way_closes_its_connection(
        poured: bool, remote_backend: MakeBackend) -> None:
    # Closing the connection is how vLLM learns to abort the generation.
    closed = asyncio.get_running_loop().create_future()
    script = events_then_silence(n=1, closed=closed)

    async with scripted_server(script) as server:
        upstream = await remote_backend(server.url).send(PATH, b"{}", {})
        if poured:  # the client left: the relay pouring the stream is cancelled
            writer = Writer()
            task = asyncio.ensure_future(pour(upstream, writer))
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert writer.bytes == EVENTS[0]
        else:
            async for data in upstream.chunks:
                assert data == EVENTS[0]
                break
        await upstream.close()
        assert await asyncio.wait_for(closed, GUARD)


@pytest.mark.parametrize("poured", [False, True])
async def test_a_stalled_stream_times_out_after_the_idle_limit(
        poured: bool, remote_backend: MakeBackend) -> None:
    closed = asyncio.get_running_loop().create_future()
    script = events_then_silence(n=2, closed=closed)

    async with scripted_server(script) as server:
        upstream = await remote_backend(server.url, idle=0.3).send(PATH, b"{}", {})
        received: list[bytes] = []
        with pytest.raises(ReplicaTimeout, match="idle"):
            await take(upstream, received, poured)
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


@pytest.mark.parametrize("poured", [False, True])
@pytest.mark.parametrize("how", ["close", "reset"])
async def test_a_stream_cut_off_by_the_replica_is_broken_after_what_arrived(
        how: str, poured: bool, remote_backend: MakeBackend) -> None:
    async def script(connection: Connection) -> None:
        await connection.read_request()
        await connection.send(STREAM_HEAD + chunk(EVENTS[0]))
        await asyncio.sleep(0.05)  # the first event read before the rest comes
        await connection.send(chunk(EVENTS[1]))
        await (connection.close() if how == "close" else connection.reset())

    async with scripted_server(script) as server:
        upstream = await remote_backend(server.url).send(PATH, b"{}", {})
        received: list[bytes] = []
        with pytest.raises(ReplicaStreamBroken):
            await take(upstream, received, poured)
        await upstream.close()
    arrived, sent = b"".join(received), EVENTS[0] + EVENTS[1]
    if how == "close":
        assert arrived == sent
    else:  # a reset may discard what the kernel had not yet handed over
        assert sent.startswith(arrived)


# --- whole (non-streaming) bodies ------------------------------------------------------

async def test_a_large_body_read_slowly_arrives_whole_and_its_connection_is_reused(
        remote_backend: MakeBackend) -> None:
    # 4 MiB, more than is queued before reading from the replica pauses: the reader
    # that lags behind resumes it, and the connection is left as it found it.
    body = bytes(range(256)) * 4096 * 4

    async def script(connection: Connection) -> None:
        while await connection.read_request() is not None:
            await connection.send(response(200, body))

    async with scripted_server(script) as server:
        backend = remote_backend(server.url)
        for _ in range(2):
            upstream = await backend.send(PATH, b"{}", {})
            received: list[bytes] = []
            async with asyncio.timeout(GUARD):
                async for data in upstream.chunks:
                    received.append(data)
                    await asyncio.sleep(0)  # a reader that lets the loop run between reads
            await upstream.close()
            assert b"".join(received) == body
    assert len(server.connections) == 1


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


# --- poured streams: flow control, and a replica that goes away ------------------------

async def test_a_full_writer_holds_the_replica_back_until_it_has_room(
        remote_backend: MakeBackend) -> None:
    # 48 MiB of 64 KiB chunks, more than the sockets' buffers on both sides hold: while
    # the client's buffer is full the replica's writes must block, not the gateway's
    # memory grow.
    stream = LongStream(768)

    async with scripted_server(stream) as server:
        upstream = await remote_backend(server.url).send(PATH, b"{}", {})
        writer = Writer(block_after=len(stream.piece) * 16)  # full after 1 MiB went through
        task = asyncio.ensure_future(pour(upstream, writer))
        await asyncio.sleep(0.5)
        held_at, written = stream.sent, writer.size
        await asyncio.sleep(0.3)
        assert not stream.finished.is_set()
        assert stream.sent == held_at < stream.pieces // 2  # the replica waits for the client
        assert writer.size == written < 3 * 1024 * 1024  # taken in before it paused
        writer.unblock()
        await task
        await upstream.close()
    assert writer.bytes == stream.body
