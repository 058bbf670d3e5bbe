"""The HTTP server: uvicorn with deadlines for slow clients, and the drain on SIGTERM.

uvicorn bounds idle keep-alive connections (``timeout_keep_alive``) and the
number of connections (``limit_concurrency``: a 503 above it), but not how
long a client may take to send its request. :class:`GuardedHttpTools` (its
httptools protocol) adds, per connection:

    header deadline   ``server.header_timeout`` (10 s) from the connection, or
                      from the first byte after an answer, until the headers are
                      complete: partial headers, 1 byte/s trickles, a connection
                      that sends only CRLFs or nothing at all get a 408 and are
                      closed
    header size       a request line and headers over ``MAX_HEADER_BYTES`` get a 431
                      and are closed, however they are cut into reads: what the
                      parser has taken apart (the URL, each name and value) is
                      counted as it comes, and so are the bytes of a read that
                      ends with the headers still incomplete (a single header
                      value the parser is still buffering)
    body deadline     ``server.body_timeout`` (30 s) from the end of the headers to
                      the end of the body: a ``Content-Length`` larger than what
                      is sent, or a trickled body, gets a 408 and is closed

and the parser's own 400 (a malformed request) is OpenAI-shaped JSON, as are
the 408s, the 503 over the connection limit, and the 400 that answers a
WebSocket upgrade (no route of the gateway speaks WebSocket; the
``websockets`` library uvicorn would hand it to is never loaded, and the
upgrade is refused before any app runs: uvicorn's own answer was an empty
403, as if the client lacked a permission). A request's ``x-request-id`` is
made safe as the header is parsed (``gateway.server.request_ids``: percent-encoded
outside visible ASCII, at most 128 bytes), so the access log, the replica
and the echo all see the same printable value. With the keep-alive timeout
(``server.keep_alive``, 75 s) and the connection limit (``server.max_connections``,
4096) a slowloris holds at most that many sockets for at most a header
deadline each.

The probe port (``health_port``): a second listening socket of the same
server, the same loop and app, whose connections serve only ``/health`` and
``/ready`` (anything else there is a 404) and are not held to the connection
limit. Clients that hold every connection make the client port answer 503,
and so its ``/health``; a liveness probe on the probe port still gets its
200, so a slowloris cannot get the pod restarted. A separate port rather
than a slot reserved on the client port: the probe's connections are then
told apart by the socket they came in on, not by a path any client can
send, so no client request gets past the limit; and the port can be kept
off the client-facing Service.

:class:`GatewayServer` takes SIGTERM/SIGINT itself: the first starts the drain
(``gateway.request.drain``; ``/ready`` 503 at once, new routed requests 503, streams
cut with an error event after ``drain_seconds``), then lets uvicorn stop, and
the process exits 0. A second signal stops at once (uvicorn's own shutdown).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

import orjson
import uvicorn
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from gateway.config import ServerSettings, Settings
from gateway.errors import error_body
from gateway.request.drain import CUT_SECONDS, Drain
from gateway.request.streaming import BODY_WRITER, ChunkedWriter
from gateway.server.balance import Balance, BalancedAcceptor
from gateway.server.request_ids import clean_request_id

log = logging.getLogger("prefixgate.server")

MAX_HEADER_BYTES = 64 * 1024
"""Request line and headers together (vLLM's and nginx's defaults are of this order)."""

GRACEFUL_SHUTDOWN = 5
"""Seconds uvicorn waits for connections once the drain is over (streams have ended)."""

SHUTDOWN_MARGIN = 30.0
"""Seconds the app's own shutdown (its lifespan's end: the linter's thread alone may take
10) may take after the drain (its period, and 5 s for the cut requests to leave) and the
graceful shutdown, before the process ends itself anyway (``GatewayServer``)."""

_TOO_LARGE = f"the request line and headers are over {MAX_HEADER_BYTES} bytes"

_REASONS = {400: b"Bad Request", 408: b"Request Timeout",
            431: b"Request Header Fields Too Large"}


WEBSOCKET_REFUSED = ("this gateway serves the OpenAI API over HTTP only: no route accepts a "
                     "WebSocket upgrade; send the request as plain HTTP")


def error_response(status: int, message: str, code: str | None = None) -> bytes:
    """A whole HTTP/1.1 response with an OpenAI-shaped error, closing the connection."""
    body = orjson.dumps(error_body(status, message, "BadRequestError",
                                   code=code or ("request_timeout" if status == 408 else None)))
    head = (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % (status, _REASONS[status], len(body)))
    return head + body


PROBE_PATHS = frozenset({"/health", "/ready", "/ping"})
"""What the probe port serves."""


class ProbesOnly:
    """The app as the probe port serves it: ``PROBE_PATHS``, else an OpenAI-shaped 404."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in PROBE_PATHS:
            await self.app(scope, receive, send)
            return
        body = orjson.dumps(error_body(404, "this port (health_port) serves only /health and "
                                       "/ready; the API is on the gateway's port",
                                       "NotFoundError"))
        await send({"type": "http.response.start", "status": 404, "headers": [
            (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body, "more_body": False})


async def _too_many_connections(scope: Scope, receive: Receive, send: Send) -> None:
    body = orjson.dumps(error_body(503, "the gateway is at its connection limit; retry shortly",
                                   "ServiceUnavailableError", code="too_many_connections"))
    await send({"type": "http.response.start", "status": 503, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
        (b"retry-after", b"1"), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class CycleBodyWriter:
    """The ``prefixgate.body_writer`` ASGI extension (``gateway.request.streaming.BodyWriter``)
    on uvicorn's httptools cycle: a streamed answer's chunks written to the connection as
    the cycle's own ``send`` writes them (chunked encoding), without a coroutine per chunk.
    The answer's start, first chunk and end still go through ``send``, which keeps the
    cycle's state (started, complete, keep-alive) its own."""

    __slots__ = ("_cycle", "write")

    def __init__(self, cycle: RequestResponseCycle) -> None:
        self._cycle = cycle
        if ChunkedWriter is not None:
            # The same write, compiled (gateway/_relay.c): a poured stream's every
            # chunk goes through it.
            self.write = ChunkedWriter(cycle)
        else:
            self.write = self._write

    def ready(self) -> bool:
        cycle = self._cycle
        return (cycle.response_started and not cycle.response_complete
                and cycle.chunked_encoding is True and cycle.scope["method"] != "HEAD")

    def _write(self, chunk: bytes) -> bool:
        cycle = self._cycle
        if chunk and not cycle.disconnected:  # send() drops a gone client's chunks too
            cycle.transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
        return not cycle.flow.write_paused

    async def drain(self) -> None:
        cycle = self._cycle
        if cycle.flow.write_paused and not cycle.disconnected:
            await cycle.flow.drain()


class _HeadersTooLarge(Exception):
    """Raised from a parser callback: the parser stops, the connection gets a 431."""


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with header and body deadlines (see the module)."""

    limits: ServerSettings = ServerSettings()
    probe_port: int | None = None
    """The probe port's number once bound (``health_port``), None without one."""
    on_closed: Callable[[], None] | None = None
    """Called once when the connection is gone (a worker's connection count,
    ``gateway.server.balance``)."""
    rebalance: Callable[[], bool] | None = None
    """Asked as each request starts: True when this worker holds more connections than
    its share, and this one should close once answered (``gateway.server.balance``)."""
    shed_marked = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.probe_port is not None and self.server is not None \
                and self.server[1] == self.probe_port:
            # A probe's connection: probes only, never held to the connection limit.
            self.app, self.limit_concurrency = ProbesOnly(self.app), None
        self._deadline: asyncio.TimerHandle | None = None
        self._header_bytes = 0
        self._parsed_header_bytes = 0
        self._headers_too_large = False
        self._arm(self.limits.header_timeout, "the request headers did not arrive in time")

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)
        if self.on_closed is not None:
            closed, self.on_closed = self.on_closed, None
            closed()

    def data_received(self, data: bytes) -> None:
        idle = self.cycle is None or self.cycle.response_complete
        if idle and self._deadline is None:  # the next request on a kept-alive connection
            self._header_bytes = 0
            self._arm(self.limits.header_timeout, "the request headers did not arrive in time")
        reading_headers = idle and self._in_headers()
        super().data_received(data)
        if reading_headers and self._in_headers():
            self._header_bytes += len(data)
            if self._header_bytes > MAX_HEADER_BYTES:
                self._refuse(431, _TOO_LARGE)

    # -- the parser's callbacks: the head counted as it is taken apart ---------------

    def on_message_begin(self) -> None:
        self._parsed_header_bytes = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)  # ": " and CRLF
        if name.lower() == b"x-request-id":
            value = clean_request_id(value.rstrip(b" \t"))
        super().on_header(name, value)

    def _count_head(self, size: int) -> None:
        self._parsed_header_bytes += size
        if self._parsed_header_bytes > MAX_HEADER_BYTES:
            # Raising stops the parser; uvicorn's data_received then calls
            # send_400_response, which answers 431 for this reason.
            self._headers_too_large = True
            raise _HeadersTooLarge

    def _in_headers(self) -> bool:
        return self._deadline is not None and self._deadline_kind == "headers"

    def on_headers_complete(self) -> None:
        self._disarm()
        if self._over_limit():
            # uvicorn's own answer over the limit is plain text: run ours in its place.
            app, limit = self.app, self.limit_concurrency
            self.app, self.limit_concurrency = _too_many_connections, None
            try:
                super().on_headers_complete()
            finally:
                self.app, self.limit_concurrency = app, limit
        else:
            super().on_headers_complete()
        if self.cycle is not None:
            extensions: dict[str, object] = self.scope.setdefault("extensions", {})  # type: ignore[assignment]
            extensions[BODY_WRITER] = CycleBodyWriter(self.cycle)
            if self.rebalance is not None and self.cycle.keep_alive \
                    and not self.shed_marked and self.rebalance():
                self.shed_marked = True
                self.cycle.keep_alive = False  # "connection: close" on the answer, then closed
        self._arm(self.limits.body_timeout, "the request body did not arrive in time",
                  kind="body")

    def _over_limit(self) -> bool:
        limit = self.limit_concurrency
        return limit is not None and (len(self.connections) >= limit
                                      or len(self.tasks) >= limit)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    # -- WebSocket upgrades: refused, whether or not a WebSocket library is installed --

    def _should_upgrade_to_ws(self) -> bool:
        return True  # so that uvicorn hands every WebSocket upgrade to the method below

    def handle_websocket_upgrade(self) -> None:
        self._refuse(400, WEBSOCKET_REFUSED, code="websocket_not_supported")

    def _unsupported_upgrade_warning(self) -> None:
        """Another upgrade (``h2c``) is served as plain HTTP: not a warning per request."""

    def send_400_response(self, msg: str) -> None:
        if self._headers_too_large:
            self._refuse(431, _TOO_LARGE)
            return
        self._disarm()
        if not self.transport.is_closing():
            self.transport.write(error_response(400, f"malformed HTTP request: {msg}"))
            self.transport.close()

    # -- deadlines -------------------------------------------------------------

    def _arm(self, seconds: float, message: str, kind: str = "headers") -> None:
        self._disarm()
        self._deadline_kind = kind
        self._deadline = self.loop.call_later(seconds, self._refuse, 408, message)

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            assert self._deadline is not None
            self._deadline.cancel()
            self._deadline = None

    def _refuse(self, status: int, message: str, code: str | None = None) -> None:
        """Answer ``status`` (unless an answer has started) and close the connection."""
        self._disarm()
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            self.transport.write(error_response(status, message, code))
        if self.cycle is not None and not self.cycle.response_complete:
            # The app reading the body hears a disconnect; its answer, if any, is dropped.
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.close()


def protocol_class(limits: ServerSettings,
                   probe_port: int | None = None) -> type[GuardedHttpTools]:
    return type("GuardedHttpToolsProtocol", (GuardedHttpTools,),
                {"limits": limits, "probe_port": probe_port})


class GatewayServer(uvicorn.Server):
    """uvicorn's server, whose first SIGTERM/SIGINT drains before it stops."""

    def __init__(self, config: uvicorn.Config, drain: Drain,
                 balance: Balance | None = None,
                 hard_exit: Callable[[int], None] | None = None) -> None:
        super().__init__(config)
        self.drain = drain
        self.hard_exit = hard_exit or _end_now
        self.balance = balance
        """A worker's: its client port is accepted from by a :class:`BalancedAcceptor`
        instead of asyncio's server."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        if self.balance is None or not sockets:
            await super().startup(sockets)
            return
        await super().startup(sockets[1:])  # the probe port, if any: uvicorn's own server
        balance = self.balance
        acceptor = BalancedAcceptor(sockets[0], self._protocol, balance.table, balance.index,
                                    backlog=self.config.backlog)
        acceptor.start()
        balance.connections.acceptor = acceptor
        self.servers.insert(0, acceptor)  # type: ignore[arg-type]  # closed as servers are

    def _protocol(self) -> asyncio.Protocol:
        """A connection's protocol, as uvicorn's own server makes it."""
        return self.config.http_protocol_class(  # type: ignore[call-arg]
            config=self.config, server_state=self.server_state,
            app_state=self.lifespan.state)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None or self._drain_task is not None or self.should_exit:
            super().handle_exit(sig, frame)  # not serving yet, or a second signal
            return
        self._loop.call_soon_threadsafe(self._begin_drain)

    def _begin_drain(self) -> None:
        if self._drain_task is None:
            self._drain_task = asyncio.ensure_future(self._drain_then_stop())
            self._arm_deadline()

    def _arm_deadline(self) -> None:
        """End the process if stopping takes longer than it may: the drain, uvicorn's
        graceful shutdown and ``SHUTDOWN_MARGIN``. A worker whose shutdown hung after its
        drain (seen once in the tests, never diagnosed) served on alone once its
        supervisor was killed, holding the port; a second signal could not end it."""
        limit = self.drain.seconds + CUT_SECONDS + GRACEFUL_SHUTDOWN + SHUTDOWN_MARGIN

        def overdue() -> None:
            log.error("stopping took over %.0f s (drain, graceful shutdown, the app's own): "
                      "exiting now", limit)
            self.hard_exit(1)

        timer = threading.Timer(limit, overdue)
        timer.daemon = True  # a process that stops in time is not held by it
        timer.start()

    async def _drain_then_stop(self) -> None:
        try:
            await self.drain.run()
        finally:
            self.should_exit = True


def _end_now(code: int) -> None:
    logging.shutdown()  # what is logged is written
    os._exit(code)


def server_config(app: Any, settings: Settings, probe_port: int | None = None) -> uvicorn.Config:
    limits = settings.server
    return uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="warning", access_log=False,
        loop="auto", http=protocol_class(limits, probe_port), ws="none",
        # uvicorn annotates whole seconds but hands the value to loop.call_later, which takes
        # a float: a fractional keep-alive is honoured as it is.
        timeout_keep_alive=limits.keep_alive,  # type: ignore[arg-type]
        limit_concurrency=limits.max_connections,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN)


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not yet listening), as uvicorn binds its own."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise SystemExit(f"prefixgate: cannot listen on {host}:{port}: {exc}") from None
    sock.set_inheritable(True)
    return sock


def bind_all(settings: Settings) -> list[socket.socket]:
    """The client port's socket, then the probe port's when ``health_port`` is set."""
    sockets = [bind(settings.host, settings.port)]
    if settings.health_port is not None:
        sockets.append(bind(settings.host, settings.health_port))
    return sockets


def serve_app(app: Any, settings: Settings, sockets: list[socket.socket] | None = None,
              announce: bool = True, balance: Balance | None = None) -> None:
    """Serve until SIGTERM/SIGINT, drain, stop; returns normally after a drain. ``sockets``:
    bound already (a worker's, inherited from the supervisor), else bound here."""
    drain = getattr(app, "drain", None) or Drain(settings.drain_seconds)
    sockets = sockets or bind_all(settings)
    probe_port = None
    if len(sockets) > 1:
        probe_port = int(sockets[1].getsockname()[1])
        if announce:
            log.info("probes: /health and /ready also on port %d, outside the connection "
                     "limit", probe_port)
    GatewayServer(server_config(app, settings, probe_port), drain, balance).run(sockets=sockets)
