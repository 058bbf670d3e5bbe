"""Which relayed route a request is for: its path and method against the table.

The table is ``gateway.server.vllm_routes.ROUTES``; the front door
(``gateway.request.front``) asks :meth:`RouteTable.match` before anything
else sees the request. Paths match as starlette matches them (its
``compile_path``: ``{response_id}`` is one path segment), in table order,
against the path less the ASGI ``root_path``:

* a route whose path and method match: that route, with its path parameters;
* only a path that matches (another method): the methods it takes, for a 405
  with ``Allow``, as starlette answers;
* a path one trailing slash away from a route's: the path to redirect to
  (307), as starlette's ``redirect_slashes`` does;
* nothing: the request is not a relayed one (the gateway's own routes never
  share a path with a relayed route).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.convertors import Convertor
from starlette.routing import compile_path
from starlette.types import Scope

from gateway.request.exchange import Route


@dataclass(frozen=True, slots=True)
class RouteMatch:
    """What the table says of one request (at most one field set)."""

    route: Route | None = None
    path_params: Mapping[str, str] | None = None
    allow: tuple[str, ...] = ()
    """The methods its path takes, when the request's method is not one of them."""
    redirect_path: str | None = None
    """The path to redirect to: one trailing slash away from a route's."""


NO_MATCH = RouteMatch()


@dataclass(frozen=True, slots=True)
class _Compiled:
    route: Route
    regex: re.Pattern[str]
    convertors: dict[str, Convertor[Any]]

    def params(self, path: str) -> dict[str, str] | None:
        found = self.regex.match(path)
        if found is None:
            return None
        return {name: self.convertors[name].convert(value)
                for name, value in found.groupdict().items()}


def route_path(scope: Scope) -> str:
    """The path the routes match: ``path`` less ``root_path`` (as starlette reads it)."""
    path: str = scope["path"]
    root = scope.get("root_path", "")
    if not root or not path.startswith(root):
        return path
    if path == root:
        return ""
    return path[len(root):] if path[len(root)] == "/" else path


class RouteTable:
    def __init__(self, routes: Sequence[Route]) -> None:
        self.routes = tuple(routes)
        self._compiled: list[_Compiled] = []
        for route in self.routes:
            regex, _, convertors = compile_path(route.path)
            self._compiled.append(_Compiled(route, regex, convertors))

    def match(self, scope: Scope) -> RouteMatch:
        path, method = route_path(scope), scope["method"]
        allow: tuple[str, ...] = ()
        for compiled in self._compiled:
            params = compiled.params(path)
            if params is None:
                continue
            if compiled.route.method == method:
                return RouteMatch(compiled.route, params)
            allow = allow or (compiled.route.method,)
        if allow:
            return RouteMatch(allow=allow)
        if path == "/":
            return NO_MATCH
        other = path.rstrip("/") if path.endswith("/") else path + "/"
        if any(compiled.params(other) is not None for compiled in self._compiled):
            full = scope["path"]
            return RouteMatch(redirect_path=full.rstrip("/") if path.endswith("/") else full + "/")
        return NO_MATCH
