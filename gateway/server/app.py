"""``create_app(settings)``: the one place where the gateway is wired together.

Nothing happens at import time. ``create_app`` builds what must fail before
the server starts (the policy from the registry, the client keys) and the
drain the server's signal handler shares, and returns a :class:`GatewayApp`.
Its lifespan runs :func:`gateway.server.start.start_gateway`: every part
built from the settings and started in order, stopped in reverse
(``gateway.server.parts`` names each part's constructor). While it runs,
every HTTP request goes to the front door it built (``gateway.request.front``):
the relayed routes straight to the request path, the gateway's own routes
through FastAPI (``gateway.server.api``).

``transport`` lets tests put an ``httpx.MockTransport`` under every replica;
``resolver`` answers the DNS names of ``replicas_from``.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

from starlette.routing import Router
from starlette.types import Receive, Scope, Send

from engine.pool.discovery import Resolver, system_resolver
from gateway.auth.keys import load_store
from gateway.config import Settings
from gateway.errors import error_body
from gateway.fleet.local import WorkerRole
from gateway.jsonresp import JSONResponse
from gateway.ops.view import OpsView
from gateway.replicas.sources import TransportFactory
from gateway.request.drain import Drain
from gateway.request.state import GatewayState
from gateway.server.parts import build_policy
from gateway.server.start import Serving, start_gateway


class GatewayApp:
    """The ASGI app the server runs: the lifespan starts the gateway, the requests go to
    its front door."""

    def __init__(self, start: Callable[[], AbstractAsyncContextManager[Serving]],
                 drain: Drain) -> None:
        """``start``: the running gateway, for the lifespan's duration; ``drain``: shared
        with the server, whose first SIGTERM starts it (``gateway.server.http``)."""
        self.drain = drain
        self._start = start
        self._lifespan = Router(lifespan=self._serving)  # starlette speaks the protocol
        self._running: Serving | None = None

    @contextlib.asynccontextmanager
    async def _serving(self, _: Any) -> AsyncIterator[None]:
        async with self._start() as serving:
            self._running = serving
            try:
                yield
            finally:
                self._running = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(scope, receive, send)
        elif self._running is not None:
            await self._running.front(scope, receive, send)
        elif scope["type"] == "http":  # before start-up ends, or after shutdown
            await JSONResponse(error_body(503, "the gateway is not serving",
                                          "ServiceUnavailableError"),
                               status_code=503)(scope, receive, send)

    @property
    def serving(self) -> Serving:
        """The running gateway (between the lifespan's start-up and its shutdown)."""
        if self._running is None:
            raise RuntimeError("the gateway is not running: its lifespan has not started")
        return self._running

    @property
    def gateway(self) -> GatewayState:
        return self.serving.state

    @property
    def ops_view(self) -> OpsView:
        return self.serving.ops_view


def create_app(settings: Settings, transport: TransportFactory | None = None,
               resolver: Resolver = system_resolver,
               worker: WorkerRole | None = None) -> GatewayApp:
    policy = build_policy(settings)  # a wrong policy or option fails here, not on a request
    keys = load_store(settings.api_keys, settings.tenant_salt_secret,
                      settings.retry_after_seconds)
    drain = Drain(settings.drain_seconds, settings.retry_after_seconds)
    start = functools.partial(start_gateway, settings, policy, keys, drain, transport, resolver,
                              worker)
    return GatewayApp(start, drain)
