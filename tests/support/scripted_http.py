"""A raw HTTP/1.1 server on 127.0.0.1 whose every connection follows a script.

For tests of an HTTP client's edge cases that a real server framework will
not produce on demand: a kept-alive connection closed as the next request
arrives, a reset, a body cut off half-way, a status line that never comes.
Each accepted connection is handed to the script as a :class:`Connection`;
the server records every request it read, in order, with the connection it
came on.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class SeenRequest:
    connection: int
    """Index of the connection it came on, from 0 in the order they were accepted."""
    method: str
    path: str
    headers: Mapping[str, str]
    """Lower-cased names."""
    body: bytes


def response(status: int, body: bytes = b"", headers: Mapping[str, str] | None = None,
             *, content_length: int | None = None) -> bytes:
    """A whole HTTP/1.1 answer; ``content_length`` may promise more than ``body`` holds."""
    length = len(body) if content_length is None else content_length
    lines = [f"HTTP/1.1 {status} Scripted", f"content-length: {length}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


STREAM_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
               b"transfer-encoding: chunked\r\n\r\n")
"""The status line and headers of a chunked server-sent-events answer."""

STREAM_END = b"0\r\n\r\n"


def chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


@dataclass(slots=True)
class Connection:
    index: int
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    seen: list[SeenRequest]

    async def read_request(self) -> SeenRequest | None:
        """The next request on this connection; ``None`` once the client has closed it."""
        try:
            head = await self.reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, path, _ = request_line.split(" ", 2)
        headers = {}
        for line in header_lines:
            if line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        request = SeenRequest(self.index, method, path, headers, body)
        self.seen.append(request)
        return request

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def close(self) -> None:
        """An orderly close (FIN), as a server does with an idle keep-alive connection."""
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()

    async def reset(self) -> None:
        """Close with a reset (RST), as a crashed or killed server's kernel does."""
        sock = self.writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await self.close()

    async def closed_by_client(self) -> bool:
        """Whether the client closes this connection (read to EOF, discarding bytes)."""
        try:
            while await self.reader.read(65536):
                pass
        except ConnectionError:
            pass
        return True


Script = Callable[[Connection], Awaitable[None]]


class LongStream:
    """A script that answers one request with ``pieces`` chunks of ``piece``, counting the
    chunks its writes got through (``sent``: a client that does not read stops them once
    the sockets' buffers are full) and noting when the whole stream went out (``finished``)."""

    def __init__(self, pieces: int, piece: bytes = bytes(range(256)) * 256) -> None:
        self.pieces = pieces
        self.piece = piece
        self.sent = 0
        self.finished = asyncio.Event()

    @property
    def body(self) -> bytes:
        return self.piece * self.pieces

    async def __call__(self, connection: Connection) -> None:
        await connection.read_request()
        await connection.send(STREAM_HEAD)
        for _ in range(self.pieces):
            await connection.send(chunk(self.piece))
            self.sent += 1
        await connection.send(STREAM_END)
        self.finished.set()


@dataclass(slots=True)
class ScriptedServer:
    url: str
    seen: list[SeenRequest]
    connections: list[Connection] = field(default_factory=list)


@contextlib.asynccontextmanager
async def scripted_server(script: Script) -> AsyncIterator[ScriptedServer]:
    """Serve on a free loopback port; every connection's script is cancelled on exit."""
    seen: list[SeenRequest] = []
    tasks: set[asyncio.Task[None]] = set()
    state: ScriptedServer | None = None

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert state is not None
        connection = Connection(len(state.connections), reader, writer, seen)
        state.connections.append(connection)
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await script(connection)
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    state = ScriptedServer(f"http://127.0.0.1:{port}", seen)
    try:
        yield state
    finally:
        server.close()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await server.wait_closed()
