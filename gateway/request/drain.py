"""Graceful drain: what the gateway does between SIGTERM and its exit.

    SIGTERM ─> draining: /ready and /ping answer 503 at once, new routed requests
    │          (POST /v1/...) get 503 ``gateway_draining`` with Retry-After
    │          (a load balancer moves them to another instance)
    ├─> requests in flight finish, for up to ``drain_seconds`` (default 30)
    ├─> then what is still running is cut: a stream ends with an SSE error
    │   event (never a truncated body), a request still waiting on a replica
    │   gets a 503
    └─> the HTTP server stops (``gateway.server.http``) and the process exits 0

:class:`Drain` keeps the set of requests in flight that can be cut (each has
a ``cut()``); the proxy registers a request's guard while it waits for a
replica and the stream relay registers itself while it relays.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Protocol

from starlette.responses import Response
from starlette.types import Scope

from gateway.errors import anthropic_error_body, error_body
from gateway.jsonresp import JSONResponse

log = logging.getLogger("prefixgate.drain")

DRAIN_MESSAGE = "the gateway is shutting down; retry on another instance"


class Cuttable(Protocol):
    def cut(self) -> None:
        """End now: a stream with an error event, a waiting request with a 503."""
        ...


CUT_SECONDS = 5.0
"""How long the requests cut at the end of the drain period have to write their last bytes."""


class Drain:
    def __init__(self, seconds: float, retry_after: int = 1) -> None:
        self.seconds = seconds
        self.retry_after = retry_after
        self.draining = False
        self.cut_done = False
        self._active: set[Cuttable] = set()
        self._idle = asyncio.Event()

    @contextlib.contextmanager
    def tracking(self, item: Cuttable) -> Iterator[None]:
        """``item`` is in flight for the duration; after the cut it is cut at once."""
        self._active.add(item)
        try:
            if self.cut_done:
                item.cut()
            yield
        finally:
            self._active.discard(item)
            if not self._active:
                self._idle.set()

    def in_flight(self) -> int:
        return len(self._active)

    def refusal(self, scope: Scope, anthropic: bool = False,
                generates: bool = False) -> Response | None:
        """While draining: the answer to a request that must not start, else None: a POST
        under ``/v1/`` or to a route that ``generates`` (``/invocations``,
        ``/inference/v1/generate``); ``anthropic``: in the Messages API's error shape."""
        if not self.draining:
            return None
        path = scope.get("path", "")
        if path == "/ready":
            return JSONResponse({"ready": False, "draining": True}, status_code=503)
        if path == "/ping":  # a load balancer's health check (SageMaker's)
            return Response(status_code=503)
        if scope.get("method") == "POST" and (generates or path.startswith("/v1/")):
            body = (anthropic_error_body(DRAIN_MESSAGE, "ServiceUnavailableError") if anthropic
                    else error_body(503, DRAIN_MESSAGE, "ServiceUnavailableError",
                                    code="gateway_draining"))
            return JSONResponse(
                body, status_code=503, headers={"retry-after": str(self.retry_after),
                                          "connection": "close"})
        return None

    async def run(self) -> None:
        """Drain: refuse new work, wait for what runs (up to ``seconds``), cut the rest."""
        self.draining = True
        log.warning("draining: %d request(s) in flight, up to %.0fs", len(self._active),
                    self.seconds)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.seconds):
                await self._wait_idle()
        self.cut_done = True
        if self._active:
            log.warning("drain period over: ending %d request(s)", len(self._active))
        for item in list(self._active):
            item.cut()
        # The cut requests write their last bytes (an error event, a 503) and leave.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(CUT_SECONDS):
                await self._wait_idle()

    async def _wait_idle(self) -> None:
        while self._active:
            self._idle.clear()
            await self._idle.wait()
