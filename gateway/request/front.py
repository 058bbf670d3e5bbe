"""The gateway's front door: what every HTTP request meets first, in this order.

    draining?         /ready 503, a new POST /v1/... or to a route    (``drain``)
                      that generates 503 (the Messages API's shaped)
    admitted?         with client keys: 401, 403 or 429; else a grant,
                      held until the answer's last byte               (``gateway.auth.keys``)
    a relayed route?  an Exchange, handed the grant and the route's
                      path parameters: read, parse, decide, forward   (``route_table``,
                      (the lifecycle hears it), the answer sent with   ``dispatch``, ``proxy``)
                      the server's own ``send``
    anything else     the gateway's own routes                        (``api``: FastAPI)

Nothing here passes through the ASGI scope: a relayed request gets what it
needs as typed values, and no framework sits between the server and its
answer, so a stream's chunks go straight to the server (``streaming``).
Errors are answered as the gateway's own routes answer them
(``gateway.errors``): a gateway error in OpenAI's shape, 499 for a client
that left while its body was read, and anything unexpected logged and
answered 500, then raised on for the server's log (as starlette does). A
path of a relayed route with another method is a 405, and a path one
trailing slash away from one is redirected (307), as starlette answers.

Every answer on an API path (not ``UNCOUNTED_PATHS``) is counted in
``prefixgate_requests_total``: an exchange's by the recorder once its
lifecycle completes it (``gateway.request.recorder``), every other one here,
with replica ``none`` and the model its exchange was resolved to if it got
that far (a 503 for a model without a healthy replica shows under that
model), so the error panels see an outage, not a gap.
"""

from __future__ import annotations

from collections.abc import Mapping

from starlette.datastructures import URL, Headers
from starlette.requests import ClientDisconnect, Request
from starlette.responses import RedirectResponse, Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.auth.keys import Access, Grant, KeyStore
from gateway.errors import GatewayError, error_response, method_not_allowed, unexpected_error
from gateway.request.body import read_body
from gateway.request.dispatch import Dispatcher
from gateway.request.drain import Drain
from gateway.request.exchange import Exchange, Route
from gateway.request.forwarding import secret_test
from gateway.request.route_table import RouteMatch, RouteTable
from gateway.request.state import GatewayState

UNCOUNTED_PATHS = ("/health", "/ready", "/metrics", "/admin", "/dashboard", "/openapi.json")
"""The gateway's own ops routes: not requests of the API, not in ``requests_total``."""


class Front:
    def __init__(self, api: ASGIApp, table: RouteTable, state: GatewayState,
                 dispatcher: Dispatcher, drain: Drain, keys: KeyStore | None = None,
                 metrics_auth: Access = "open") -> None:
        """``api``: the gateway's own routes; ``table``: the relayed ones."""
        self.api = api
        self.table = table
        self.dispatcher = dispatcher
        self.proxy = state.proxy
        self.metrics = state.metrics
        self.preparing = state.preparing
        self.drain = drain
        self.keys = keys
        self.metrics_auth = metrics_auth
        self.max_body_bytes = state.settings.max_body_bytes
        self.is_secret = secret_test(state.settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.api(scope, receive, send)  # a WebSocket: FastAPI refuses it
            return
        counted = not scope["path"].startswith(UNCOUNTED_PATHS)
        match = self.table.match(scope)
        route = match.route
        anthropic = route is not None and route.errors == "anthropic"
        refusal = self.drain.refusal(scope, anthropic, route is not None
                                     and route.routing == "prefix")
        grant: Grant | None = None
        if refusal is None and self.keys is not None:
            try:
                grant = self.keys.admit_request(scope["path"], Headers(scope=scope),
                                                self.metrics_auth)
            except GatewayError as exc:
                refusal = error_response(exc, anthropic)
        if refusal is not None:
            await self._answer(refusal, scope, receive, send, counted)
            return
        try:
            await self._route(match, grant, scope, receive, send, counted)
        finally:
            if grant is not None:
                grant.release()

    async def _route(self, match: RouteMatch, grant: Grant | None, scope: Scope,
                     receive: Receive, send: Send, counted: bool) -> None:
        if match.route is not None:
            await self._relayed(match.route, match.path_params or {}, grant,
                                scope, receive, send)
        elif match.allow:
            await self._answer(method_not_allowed(match.allow), scope, receive, send, counted)
        elif match.redirect_path is not None:
            target = URL(scope={**scope, "path": match.redirect_path})
            await self._answer(RedirectResponse(str(target)), scope, receive, send, counted)
        elif counted:
            seen = _StatusSeen(send)
            try:
                await self.api(scope, receive, seen)
            finally:
                if seen.status:
                    self._count("", seen.status)
        else:
            await self.api(scope, receive, send)

    async def _relayed(self, route: Route, path_params: Mapping[str, str], grant: Grant | None,
                       scope: Scope, receive: Receive, send: Send) -> None:
        exchange = Exchange(Request(scope, receive), route, path_params, grant)
        try:
            response = await self._exchange(exchange)
        except GatewayError as exc:
            response = error_response(exc, route.errors == "anthropic")
        except ClientDisconnect:  # gone while its body was read: nobody to answer
            response = Response(status_code=499)
        except Exception:
            await self._answer(unexpected_error(scope["path"]), scope, receive, send,
                               not exchange.completed, exchange.model)
            raise
        try:
            await response(scope, receive, send)
        finally:
            if not exchange.completed:  # refused: no observer heard of it
                self._count(exchange.model, response.status_code)

    async def _exchange(self, exchange: Exchange) -> Response:
        """read -> parse -> decide (the lifecycle hears it) -> forward (and it hears the rest)."""
        with self.preparing.request():  # what waits for the gateway's own time, waits
            exchange.parse(await read_body(exchange.client, self.max_body_bytes), self.is_secret)
            await self.dispatcher.decide(exchange)
            self.proxy.lifecycle.decided(exchange)
        return await self.proxy.forward(exchange)

    async def _answer(self, response: Response, scope: Scope, receive: Receive, send: Send,
                      counted: bool, model: str = "") -> None:
        try:
            await response(scope, receive, send)
        finally:
            if counted:
                self._count(model, response.status_code)

    def _count(self, model: str, status: int) -> None:
        self.metrics.requests.labels(model or "none", "none", str(status)).inc()


class _StatusSeen:
    """A ``send`` that remembers the status it started a response with."""

    __slots__ = ("send", "status")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.status = 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)
