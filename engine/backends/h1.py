"""HTTP/1.1 to one replica on asyncio's protocol layer, parsed by httptools (C).

A replica's answer arrives in ``data_received`` and is parsed there; a chunk of
its body is either queued for a reader (``Body``: the first chunk, a
non-streaming body) or, once a relay hands over a writer (``Body.pour``),
written on from inside ``data_received`` itself: no future, no task wake-up
and no async iterator between a token's bytes arriving from the replica and
leaving for the client. At a hundred streams that per-chunk path is most of
what a relay costs (see docs/benchmarks/overhead.md, "A protocol-level relay").

One request at a time per connection; kept-alive connections are pooled
(``Connections``) and dropped after ``KEEPALIVE`` seconds idle, less than
vLLM's (uvicorn's) 5 s, so a request is rarely written into a connection the
server is closing. Flow control both ways: a reader that lets more than
``_HIGH_WATER`` bytes queue up pauses reading from the replica, and so does a
writer whose client is not reading (``write`` returns False, ``drain`` waits).

Failures are ``engine.errors`` types; what they mean to the caller (resend,
fail over) is ``engine.backends.remote``'s and the proxy's business.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import socket
import ssl
from collections.abc import Awaitable, Callable, Mapping
from typing import cast
from urllib.parse import urlsplit

import httptools

from engine.errors import EngineError, ReplicaStreamBroken, ReplicaTimeout

KEEPALIVE = 2.0
"""Seconds a connection may sit idle in the pool before it is closed."""
DNS_TTL = 60.0
"""Seconds a replica's host name stays resolved (a failed connect resolves it again)."""
_HIGH_WATER = 256 * 1024
"""Queued body bytes over which reading from the replica pauses until the reader catches up."""

Write = Callable[[bytes], bool]
"""Takes one body chunk; False when the client's buffer is full (then ``drain`` is awaited)."""


class Disconnected(Exception):
    """The connection ended before a status line: the replica closed it or reset it."""


class Target:
    """Where a replica's requests go: host, port, TLS, and the base URL's path."""

    __slots__ = ("host", "netloc", "port", "prefix", "ssl")

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.netloc = parts.netloc.rpartition("@")[2]
        self.prefix = parts.path.rstrip("/")
        self.ssl: ssl.SSLContext | None = (ssl.create_default_context()
                                           if parts.scheme == "https" else None)

    def request(self, method: str, path: str, headers: Mapping[str, str], body: bytes) -> bytes:
        """The request's bytes: its line, ``host``, a length when there is a body or the
        method carries one, ``headers``, then ``body``."""
        lines = [f"{method} {self.prefix}{path} HTTP/1.1\r\nhost: {self.netloc}\r\n"]
        if body or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            lines.append(f"content-length: {len(body)}\r\n")
        for name, value in headers.items():
            if "\r" in value or "\n" in value or "\r" in name or "\n" in name:
                raise ValueError(f"header {name!r} holds a line break")
            lines.append(f"{name}: {value}\r\n")
        lines.append("\r\n")
        return "".join(lines).encode("latin-1", "replace") + body


class Connection(asyncio.Protocol):
    """One connection to the replica, and the answer to the request now on it."""

    def __init__(self, replica_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.replica_id = replica_id
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self.lost = False
        self.idle_since = 0.0
        self._reading_paused = False
        self._begin()

    def _begin(self) -> None:
        self.head: asyncio.Future[None] = self.loop.create_future()
        self.status = 0
        self.headers: dict[str, str] = {}
        self._framed = False
        """The answer has a length or is chunked (else its body ends when the connection does)."""
        self._keep_alive = False
        self.ended = False
        self.error: EngineError | None = None
        self._queue: collections.deque[bytes] = collections.deque()
        self._queued = 0
        self._waiter: asyncio.Future[None] | None = None
        self._write: Write | None = None
        self._write_blocked = False
        self.waiting_since = 0.0
        """Loop time since which a reader has been waiting for body bytes (0: none waits)."""

    def send(self, data: bytes) -> None:
        """Write a request on this connection (kept alive, or just made)."""
        assert self.transport is not None
        self._begin()
        self.transport.write(data)

    @property
    def reusable(self) -> bool:
        return self.ended and self.error is None and not self.lost and self._keep_alive

    def abort(self) -> None:
        """Close at once: vLLM aborts a request whose connection closes."""
        if self.transport is not None:
            self.transport.abort()

    # -- asyncio's protocol callbacks ---------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ReplicaStreamBroken(self.replica_id, f"malformed answer: {exc}"))
            self.abort()

    def eof_received(self) -> bool | None:
        return None  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.head.done():
            self.head.set_exception(Disconnected(
                f"{type(exc).__name__}: {exc}" if exc else
                "ServerDisconnected: the replica closed the connection before answering"))
            self.head.exception()  # retrieved: a timed-out sender may no longer await it
        elif not self.ended and self.error is None:
            if not self._framed:  # a body that ends where its connection does
                self.on_message_complete()
            else:
                why = f"{type(exc).__name__}: {exc}" if exc else "the replica closed the connection"
                self._fail(ReplicaStreamBroken(self.replica_id, f"body cut short ({why})"))

    # -- httptools' callbacks -----------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        if key in ("content-length", "transfer-encoding"):
            self._framed = True
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        if self.status < 200:  # 1xx: the real answer follows
            self.headers = {}
            self._framed = False
            return
        self._keep_alive = self._parser.should_keep_alive()
        if not self.head.done():
            self.head.set_result(None)

    def on_body(self, body: bytes) -> None:
        write = self._write
        if write is not None:
            if write(body):
                self.waiting_since = self.loop.time()
            elif not self._write_blocked:  # the client is full: the pour waits for room
                self._write_blocked = True
                self._pause()
                self._wake()
            return
        self._queue.append(body)
        self._queued += len(body)
        if self._queued > _HIGH_WATER:
            self._pause()
        self.waiting_since = 0.0
        self._wake()

    def on_message_complete(self) -> None:
        if self.status < 200:
            return
        self.ended = True
        self._wake()

    # -- for Body -------------------------------------------------------------------------

    def _fail(self, error: EngineError) -> None:
        if self.error is None and not self.ended:
            self.error = error
            self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _pause(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    async def _wait(self) -> None:
        self.waiting_since = self.waiting_since or self.loop.time()
        waiter = self._waiter = self.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None


class Body:
    """The body of one answer: read chunk by chunk (``async for``), then, optionally,
    poured into a writer as it arrives (``pour``). ``close`` hands the connection back
    to the pool when the body was read to its end, and closes it otherwise.

    A reader waiting longer than ``idle`` seconds for the next bytes (``first`` for the
    first ones) fails with ``ReplicaTimeout``; the timer looks once per ``idle``, it is
    not re-armed per chunk.
    """

    def __init__(self, connection: Connection, pool: Connections, first: float,
                 idle: float) -> None:
        self._connection = connection
        self._pool = pool
        self._limit = first
        self._idle = idle
        self._closed = False
        loop = connection.loop
        self._timer = loop.call_at(loop.time() + min(first, idle), self._check)

    def _check(self) -> None:
        connection = self._connection
        if connection.ended or connection.error is not None:
            return
        loop = connection.loop
        since = connection.waiting_since
        if since and loop.time() - since >= self._limit:
            connection._fail(ReplicaTimeout(connection.replica_id, "stream idle for too long"))
            connection.abort()
            return
        self._timer = loop.call_at((since or loop.time()) + min(self._limit, self._idle),
                                   self._check)

    def __aiter__(self) -> Body:
        return self

    async def __anext__(self) -> bytes:
        connection = self._connection
        while True:
            queue = connection._queue
            if queue:
                chunk = queue.popleft()
                connection._queued -= len(chunk)
                if connection._queued <= _HIGH_WATER // 2:
                    connection._resume()
                self._limit = self._idle
                return chunk
            if connection.error is not None:
                raise connection.error
            if connection.ended or self._closed:
                raise StopAsyncIteration
            await connection._wait()

    async def pour(self, write: Write, drain: Callable[[], Awaitable[None]]) -> None:
        """Hand every chunk still to come to ``write`` as it arrives, until the body ends
        (returns) or fails (raises its ``EngineError``). Cancelled, it stops writing."""
        connection = self._connection
        self._limit = self._idle
        while connection._queue:
            chunk = connection._queue.popleft()
            connection._queued -= len(chunk)
            if not write(chunk):
                connection._write_blocked = True
        connection._write = write
        if not connection._write_blocked:
            connection._resume()  # paused if the queue had filled up before the pour
        try:
            while True:
                if connection._write_blocked:
                    connection._pause()
                    connection.waiting_since = 0.0
                    await drain()
                    connection._write_blocked = False
                    connection.waiting_since = connection.loop.time()
                    connection._resume()
                    continue
                if connection.error is not None:
                    raise connection.error
                if connection.ended:
                    return
                await connection._wait()
        finally:
            connection._write = None

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._timer.cancel()
        connection = self._connection
        if connection.reusable:
            connection._resume()  # paused if its end came in while a reader lagged behind
            self._pool.put(connection)
        else:
            connection.abort()


class Connections:
    """A replica's kept-alive connections, the most recently used first."""

    def __init__(self, replica_id: str, target: Target, limit: int) -> None:
        self.replica_id = replica_id
        self.target = target
        self.limit = limit
        self._idle: collections.deque[Connection] = collections.deque()
        self._addresses: list[tuple[int, str, int]] = []
        self._resolved_at = 0.0
        self._lookup: asyncio.Future[list[tuple[int, str, int]]] | None = None

    def pooled(self) -> Connection | None:
        """The most recently used idle connection still open and fresh, if any."""
        idle = self._idle
        if not idle:
            return None
        now = idle[0].loop.time()
        while idle:
            connection = idle.pop()
            if not connection.lost and now - connection.idle_since < KEEPALIVE:
                return connection
            connection.abort()
        return None

    async def connect(self, timeout: float) -> Connection:
        """A new connection, to the first of the host's addresses that takes one;
        ``TimeoutError`` or ``OSError`` when none can be made."""
        loop = asyncio.get_running_loop()
        target = self.target
        async with asyncio.timeout(timeout):
            failure: OSError | None = None
            for family, address, port in await self._resolve(loop):
                try:
                    _, connection = await loop.create_connection(
                        functools.partial(Connection, self.replica_id, loop), address, port,
                        family=family, ssl=target.ssl,
                        server_hostname=target.host if target.ssl else None)
                    return connection
                except OSError as exc:
                    failure = exc
            self._resolved_at = 0.0  # the replica may have moved: look it up again next time
            raise failure or OSError(f"{target.host} has no address")

    async def _resolve(self, loop: asyncio.AbstractEventLoop) -> list[tuple[int, str, int]]:
        """The host's addresses, looked up at most once per ``DNS_TTL`` (as aiohttp's
        resolver cache did), one lookup shared by every connection a burst opens meanwhile."""
        if self._addresses and loop.time() - self._resolved_at < DNS_TTL:
            return self._addresses
        if self._lookup is None:
            self._lookup = asyncio.ensure_future(self._look_up(loop))
            # retrieved even when every connect that waited on it timed out first
            self._lookup.add_done_callback(lambda done: done.cancelled() or done.exception())
        lookup = self._lookup
        try:
            return await asyncio.shield(lookup)
        finally:
            if lookup.done() and self._lookup is lookup:
                self._lookup = None

    async def _look_up(self, loop: asyncio.AbstractEventLoop) -> list[tuple[int, str, int]]:
        target = self.target
        found = await loop.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM)
        self._addresses = [(family, str(sockaddr[0]), int(sockaddr[1]))
                           for family, _, _, _, sockaddr in found]
        self._resolved_at = loop.time()
        return self._addresses

    def put(self, connection: Connection) -> None:
        idle = self._idle
        now = connection.loop.time()
        while idle and now - idle[0].idle_since >= KEEPALIVE:
            idle.popleft().abort()
        if len(idle) >= self.limit:
            connection.abort()
            return
        connection.idle_since = now
        idle.append(connection)

    def close(self) -> None:
        while self._idle:
            self._idle.pop().abort()
