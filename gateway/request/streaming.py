"""An ASGI response that relays a replica's stream and cleans up however it ends.

It takes an iterator of chunks and one completion hook (as starlette's
``StreamingResponse`` takes an iterator and a background task), and
optionally the first chunk already read and a usage observer each chunk is
shown on its way (``StreamObserver``: a plain call per chunk, not
another async iterator layered on the replica's): the hook is
told once how the stream ended (``RelayEnd``), whatever way it ends — after
the last byte, on an upstream failure, or when the client goes away — and
releases what the request acquired (the proxy's: the replica lease, the
upstream response). Its ``send`` is the server's own: the front door
(``gateway.request.front``) puts no middleware between, so none of the
chunks a busy gateway relays (thousands a second) passes through a wrapper.

After the first chunk, a stream whose upstream can ``pour`` (the remote
backend: ``engine.backends.h1``) on a server that offers a ``BodyWriter`` (the
ASGI extension ``prefixgate.body_writer``: ``gateway.server.http``) is not
iterated at all: every chunk goes from the replica's connection to the
client's in the call that parsed it, and a client whose buffer is full
pauses the reading from the replica until it has room. Elsewhere
(in-process engines, test transports) the chunks are iterated and sent one
by one.

A disconnect is noticed by listening on ``receive`` while relaying, and it
cancels the relay, which closes the upstream connection: vLLM then aborts
the request and frees its KV blocks.

An upstream failure after the first byte cannot be retried (the client has
part of the answer), so it ends the stream with an OpenAI-shaped error event
that the official client raises as an ``APIError`` (on the Anthropic Messages
API, the ``event: error`` Anthropic's SDKs raise). So does the end of the
gateway's drain period (``cut``, see ``gateway.request.drain``): a stream is never
left as a truncated body.

For that event to be read, an event stream is relayed whole events at a time
(``EventEdge``): a replica that dies in the middle of writing an event leaves
half of it in its last chunk, and relayed as it came, that half and the error
event made one line of broken JSON, which the official client raised as a
``JSONDecodeError`` (not an ``openai`` error at all). A chunk that ends an
event, as vLLM's every chunk does, passes untouched; the bytes after a chunk's
last complete event wait for the rest of their event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from engine.backends.base import Pour
from engine.errors import EngineError
from gateway.errors import anthropic_error_body, error_body
from gateway.request.drain import Drain
from gateway.request.usage import StreamObserver

try:
    from gateway._relay import ChunkedWriter
    from gateway._relay import EventTap as _CompiledTap
except ImportError:  # the extension was not built: the Python twins serve
    ChunkedWriter = None
    _CompiledTap = None

BODY_WRITER = "prefixgate.body_writer"
"""The ASGI extension (``scope["extensions"]``) of a server that takes a streamed answer's
chunks by a plain call (``gateway.server.http.CycleBodyWriter``)."""


class BodyWriter(Protocol):
    def ready(self) -> bool:
        """The answer has started, chunked, and is not complete: ``write`` may be used."""
        ...

    def write(self, chunk: bytes) -> bool:
        """Write one chunk of the answer; False when the client's buffer is full."""
        ...

    async def drain(self) -> None:
        """Return once the client's buffer has room again (or the client left)."""
        ...


def error_event(status: int, message: str, type_: str, code: str,
                anthropic: bool = False) -> bytes:
    """An error as the last SSE event of a stream: OpenAI-shaped (a ``data:`` event the
    official client raises as an ``APIError``), or, on the Anthropic Messages API, the
    ``error`` event Anthropic's clients raise (an unnamed event they would skip)."""
    if anthropic:
        return (b"event: error\ndata: " + orjson.dumps(anthropic_error_body(message, type_))
                + b"\n\n")
    return b"data: " + orjson.dumps(error_body(status, message, type_, code=code)) + b"\n\n"


EVENT_ENDS = (b"\n\n", b"\r\n\r\n", b"\r\r")
"""What ends a server-sent event: a blank line, in any of the three line ends."""


class EventEdge:
    """An event stream cut at its events' ends: ``take`` returns what of a chunk ends
    complete events and keeps the rest until the event it starts is complete; ``rest``
    is what is kept (the stream's end writes it, an error drops it)."""

    __slots__ = ("held",)

    LIMIT = 1 << 20
    """Bytes kept at most: an "event" longer than this is not an event stream's; it goes
    out as it comes."""

    def __init__(self) -> None:
        self.held = b""

    def take(self, chunk: bytes) -> bytes:
        if self.held:
            chunk, self.held = self.held + chunk, b""
        if chunk.endswith(EVENT_ENDS) or not chunk:
            return chunk
        end = max((at + len(edge) for edge in EVENT_ENDS
                   if (at := chunk.rfind(edge)) >= 0), default=0)
        if len(chunk) - end > self.LIMIT:
            return chunk
        self.held = chunk[end:]
        return chunk[:end]

    def rest(self) -> bytes:
        held, self.held = self.held, b""
        return held


class PyEventTap:
    """What a poured stream calls with each chunk: counts it as the usage observer would
    (events, bytes, the stream's tail; ``StreamObserver.merge`` takes them at the end),
    hands a chunk that does not end an event to the ``edge`` (None: not an event
    stream), and writes the rest with ``write``. ``EventTap`` is this, compiled
    (``gateway/_relay.c``), where the extension is built."""

    __slots__ = ("_edge", "_seen", "_write")

    def __init__(self, edge: EventEdge | None, write: Callable[[bytes], bool]) -> None:
        self._edge = edge
        self._write = write
        self._seen = StreamObserver()

    def __call__(self, chunk: bytes) -> bool:
        self._seen.feed(chunk)
        edge = self._edge
        # A chunk that ends an event (every vLLM chunk) makes no call more.
        if edge is not None and (edge.held or not chunk.endswith(EVENT_ENDS)):
            chunk = edge.take(chunk)
            if not chunk:
                return True
        return self._write(chunk)

    @property
    def events(self) -> int:
        return self._seen.events

    @property
    def size(self) -> int:
        return self._seen.bytes

    def tail(self) -> list[bytes]:
        return self._seen.tail()


EventTap: Callable[[EventEdge | None, Callable[[bytes], bool]], PyEventTap] = \
    _CompiledTap if _CompiledTap is not None else PyEventTap
"""A poured stream's tap: the compiled one where ``gateway._relay`` is built."""


class StreamCut(Exception):
    """The gateway ended the stream (its drain period is over)."""


@dataclass(frozen=True, slots=True)
class RelayEnd:
    """How a relayed stream ended, told to its one completion hook."""

    error: BaseException | None
    """Why it ended early: the replica failed (``EngineError``), the drain cut it
    (``StreamCut``), the client left (anything else); None when it ran to its end."""
    first_sent_at: float | None
    """``time.perf_counter()`` when its first chunk went to the client (None: never)."""


class RelayStream(Response):
    """``chunks`` relayed as they come; ``on_complete`` told once how it ended.

    Like starlette's ``StreamingResponse``: an iterator and one hook. ``drain``,
    when given, holds the stream while it relays so its end can cut it;
    ``disconnected`` is the proxy's watch on the client (done when it left),
    else the relay watches ``receive`` itself. ``first``: the first chunk, already
    read from the replica (None: read it from ``chunks``); ``observer`` is shown
    every chunk relayed, ``first`` included (a poured stream's by its tap, merged in
    when the pour ends). ``events``: the body is an event stream,
    relayed whole events at a time (``EventEdge``).
    """

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        status_code: int,
        headers: Mapping[str, str],
        on_complete: Callable[[RelayEnd], Awaitable[None]],
        *,
        first: bytes | None = None,
        observer: StreamObserver | None = None,
        drain: Drain | None = None,
        disconnected: asyncio.Future[None] | None = None,
        pour: Pour | None = None,
        anthropic: bool = False,
        events: bool = False,
    ) -> None:
        # Not Response.__init__: it would add a content-length for an empty body.
        self.chunks = chunks
        self.pour = pour
        self.anthropic = anthropic
        self.edge = EventEdge() if events else None
        self.first = first
        self.observer = observer
        self.status_code = status_code
        self.background = None
        self.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                            for k, v in headers.items()]
        self.on_complete = on_complete
        self.drain = drain
        self.disconnected = disconnected
        self.first_sent_at: float | None = None
        self._relay_task: asyncio.Future[None] | None = None
        self._tap: PyEventTap | None = None
        self._cut = False

    def cut(self) -> None:
        """End the stream now with an error event (the drain period is over)."""
        self._cut = True
        if self._relay_task is not None:
            self._relay_task.cancel()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        outcome: BaseException | None = None
        try:
            # The start and the first chunk go out from the handler's own task.
            # A new task would first wait its turn behind everything the loop
            # has ready: under load, the burst of other streams' chunks that a
            # replica's engine step releases at once, which is when a first
            # token arrives.
            with self.drain.tracking(self) if self.drain else contextlib.nullcontext():
                await self._begin(send)
                writer = (scope.get("extensions") or {}).get(BODY_WRITER) if self.pour else None
                outcome = await self._relay_rest(receive, send, writer)
        except BaseException as exc:
            outcome = exc
            raise
        finally:
            # What a pour's tap counted (here, not in the relay task: a cancelled
            # handler does not wait for that task's end).
            if self._tap is not None and self.observer is not None:
                self.observer.merge(self._tap.events, self._tap.size, self._tap.tail())
            await self.on_complete(RelayEnd(outcome, self.first_sent_at))

    async def _begin(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        first = self.first if self.first is not None else await anext(self.chunks, b"")
        self.first = None
        if self.observer is not None:
            self.observer.feed(first)
        if self.edge is not None:
            first = self.edge.take(first)
        await send({"type": "http.response.body", "body": first, "more_body": True})
        self.first_sent_at = time.perf_counter()

    async def _relay_rest(self, receive: Receive, send: Send,
                          writer: BodyWriter | None) -> BaseException | None:
        """Relay the rest until it ends (its error, or None) or the client leaves."""
        relay = self._relay_task = asyncio.ensure_future(self._relay(send, writer))
        if self._cut:
            relay.cancel()
        watcher = self.disconnected or asyncio.ensure_future(wait_disconnect(receive))
        try:
            done, _ = await asyncio.wait({relay, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            relay.cancel()
            raise
        finally:
            watcher.cancel()
        if relay in done and not relay.cancelled():
            return relay.exception()
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await relay
        if self._cut and watcher not in done:
            await send({"type": "http.response.body", "more_body": False,
                        "body": error_event(503, "the gateway is shutting down: stream ended",
                                            "ServiceUnavailableError", "gateway_draining",
                                            self.anthropic)})
            return StreamCut("the drain period is over")
        return ConnectionAbortedError("client disconnected")

    async def _relay(self, send: Send, writer: BodyWriter | None) -> None:
        observer = self.observer
        edge = self.edge
        try:
            if writer is not None and self.pour is not None and writer.ready():
                # Each chunk goes from the replica's connection to the client's as it
                # is parsed, through one call (compiled where gateway._relay is built):
                # no task step per chunk.
                self._tap = EventTap(edge, writer.write)
                await self.pour(self._tap, writer.drain)
            else:
                async for chunk in self.chunks:
                    if observer is not None:
                        observer.feed(chunk)
                    if edge is not None:
                        chunk = edge.take(chunk)
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except EngineError as exc:
            payload = error_event(502, f"the replica failed mid-stream: {exc.detail}",
                                  "BadGatewayError", "upstream_stream_broken", self.anthropic)
            await send({"type": "http.response.body", "body": payload, "more_body": False})
            raise
        # An event the replica left incomplete at the body's end goes as it came.
        await send({"type": "http.response.body", "body": edge.rest() if edge else b"",
                    "more_body": False})


async def wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
