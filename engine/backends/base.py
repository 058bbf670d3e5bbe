"""The one seam between the gateway and a replica.

A ``Backend`` sends one request and hands back an :class:`UpstreamResponse`
whose body is read as a stream of byte chunks — the gateway forwards those
bytes unchanged (SSE passthrough). The remote implementation speaks HTTP to a
vLLM server; an in-process engine implements the same two methods. Nothing
above this protocol branches on which implementation it holds.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

DROP_REQUEST_HEADERS = frozenset({"host", "content-length", "connection", "transfer-encoding",
                                  "accept-encoding", "keep-alive", "upgrade", "te"})
"""Hop-by-hop and length headers: the gateway's to set, not the client's to forward.

(The gateway drops the rest of RFC 9110's hop-by-hop set, and the headers a
``Connection`` names, before a request gets here: ``gateway.request.forwarding``.)
``accept-encoding`` is dropped too: the gateway reads answers (usage, ids), so
it asks for them uncompressed."""

JSON = "application/json"
"""The content type of the bodies the gateway writes itself (its render checks)."""


def outgoing_headers(headers: Mapping[str, str], auth: Mapping[str, str]) -> dict[str, str]:
    """The headers a backend sends: the caller's less hop-by-hop ones, and its own auth.
    The content type is the caller's, and none when it named none: a client's body sent
    without one reaches vLLM without one, which vLLM refuses as it would directly (a
    400: only ``application/json`` is allowed; a JSON type added here made it a 200)."""
    out = {k: v for k, v in headers.items() if k.lower() not in DROP_REQUEST_HEADERS}
    out.update(auth)
    return out


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect: float = 5.0
    """Seconds to establish a connection."""
    first_byte: float = 30.0
    """Seconds until a stream's status line and first chunk (the time to first token,
    queueing included). Enforced by the gateway's proxy, which fails over when it passes
    — unless the replica is still working through a queue (it made progress in the
    last ``first_byte`` seconds and has requests waiting): then the request is queued,
    not lost, and keeps waiting, up to ``response``."""
    response: float = 300.0
    """Seconds until a response's status line. vLLM sends a non-streaming answer's
    status line when the answer is complete, so this bounds the whole generation;
    a replica that hangs meanwhile is caught sooner by its breaker (health probes)."""
    idle: float = 30.0
    """Seconds allowed between two chunks of a body (a stream's tokens, or a
    non-streaming body once its status line came). The first chunk is bounded by
    ``response`` and, for a stream, by the proxy's ``first_byte`` rule."""
    probe: float = 2.0
    """Seconds for health checks and metric scrapes: ``/health`` is trivial, so a
    replica that takes longer has stopped answering."""


Pour = Callable[[Callable[[bytes], bool], Callable[[], Awaitable[None]]], Awaitable[None]]
"""``pour(write, drain)``: every chunk still to come goes to ``write`` as it arrives (False
back: the client's buffer is full, ``drain`` is awaited before the next); returns at the
body's end, raises its ``engine.errors`` failure."""


@dataclass(slots=True)
class UpstreamResponse:
    status_code: int
    headers: Mapping[str, str]
    chunks: AsyncIterator[bytes]
    """The body as it arrives; raises ``engine.errors`` types on failure."""
    close: Callable[[], Awaitable[None]]
    pour: Pour | None = None
    """When the backend can: hand the rest of the body to a writer as it arrives, with no
    task step per chunk (``engine.backends.h1.Body.pour``); ``chunks`` otherwise."""

    async def read(self) -> bytes:
        try:
            return b"".join([chunk async for chunk in self.chunks])
        finally:
            await self.close()


class Backend(Protocol):
    replica_id: str

    async def send(
        self, path: str, body: bytes, headers: Mapping[str, str], method: str = "POST"
    ) -> UpstreamResponse:
        """Send ``body`` to ``path`` (``method``, POST unless said; its ``content-type``
        the one in ``headers``, none without); returns once the status line arrived."""
        ...

    async def get(self, path: str) -> tuple[int, bytes]:
        """A small GET (``/health``, ``/metrics``, ``/v1/models``, ``/version``) with the
        probe timeout."""
        ...

    async def aclose(self) -> None:
        ...
