"""An ASGI response that relays a replica's stream and cleans up however it ends.

It owns what the request acquired (the replica lease, the upstream response)
through an ``ExitStack``/close callback and releases it in ``finally`` —
after the last byte, on an upstream failure, or when the client goes away.
A disconnect is noticed by listening on ``receive`` while relaying, and it
cancels the relay, which closes the upstream connection: vLLM then aborts
the request and frees its KV blocks.

An upstream failure after the first byte cannot be retried (the client has
part of the answer), so it ends the stream with an OpenAI-shaped error event
that the official client raises as an ``APIError``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping

import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from engine.errors import EngineError

from .errors import error_body

RAW_SEND = "prefixgate.send"
"""Scope key of the server's unwrapped ``send`` (set by ``gateway.app.GatewayApp``)."""


class RelayStream(Response):
    def __init__(
        self,
        first_chunk: bytes,
        rest: AsyncIterator[bytes],
        status_code: int,
        headers: Mapping[str, str],
        on_chunk: Callable[[bytes], None],
        on_finish: Callable[[BaseException | None], Awaitable[None]],
        on_first_sent: Callable[[], None] | None = None,
    ) -> None:
        # Not Response.__init__: it would add a content-length for an empty body.
        self.first_chunk = first_chunk
        self.rest = rest
        self.status_code = status_code
        self.background = None
        self.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1"))
                            for k, v in headers.items()]
        self.on_chunk = on_chunk
        self.on_finish = on_finish
        self.on_first_sent = on_first_sent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body_send = scope.get(RAW_SEND, send)
        outcome: BaseException | None = None
        try:
            # The start and the first chunk go out from the handler's own task.
            # A new task would first wait its turn behind everything the loop
            # has ready: under load, the burst of other streams' chunks that a
            # replica's engine step releases at once, which is when a first
            # token arrives.
            await self._begin(send, body_send)
            outcome = await self._relay_rest(receive, send, body_send)
        except BaseException as exc:
            outcome = exc
            raise
        finally:
            await self.on_finish(outcome)

    async def _begin(self, send: Send, body_send: Send) -> None:
        # The start goes through the middlewares (they note that a response
        # began); the body chunks go straight to the server.
        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        self.on_chunk(self.first_chunk)
        await body_send({"type": "http.response.body", "body": self.first_chunk,
                         "more_body": True})
        if self.on_first_sent is not None:
            self.on_first_sent()

    async def _relay_rest(self, receive: Receive, send: Send,
                          body_send: Send) -> BaseException | None:
        """Relay the rest until it ends (its error, or None) or the client leaves."""
        relay = asyncio.ensure_future(self._relay(send, body_send))
        watcher = asyncio.ensure_future(wait_disconnect(receive))
        try:
            done, _ = await asyncio.wait({relay, watcher}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            relay.cancel()
            raise
        finally:
            watcher.cancel()
        if relay in done:
            return relay.exception()
        relay.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await relay
        return ConnectionAbortedError("client disconnected")

    async def _relay(self, send: Send, body_send: Send) -> None:
        on_chunk = self.on_chunk
        try:
            async for chunk in self.rest:
                on_chunk(chunk)
                await body_send({"type": "http.response.body", "body": chunk, "more_body": True})
        except EngineError as exc:
            event = error_body(502, f"the replica failed mid-stream: {exc.detail}",
                               "BadGatewayError", code="upstream_stream_broken")
            payload = b"data: " + orjson.dumps(event) + b"\n\n"
            await send({"type": "http.response.body", "body": payload, "more_body": False})
            raise
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
