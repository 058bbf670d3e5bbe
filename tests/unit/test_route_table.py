"""Which relayed route a request is for, as starlette's router would have matched it."""

from __future__ import annotations

from typing import Any

from gateway.request.route_table import RouteTable, route_path
from gateway.server.vllm_routes import ROUTES

TABLE = RouteTable(ROUTES)


def http(method: str, path: str, root_path: str = "") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": path, "root_path": root_path}


def test_a_path_and_method_of_the_table_is_its_route_with_its_parameters() -> None:
    chat = TABLE.match(http("POST", "/v1/chat/completions"))
    assert chat.route is not None and chat.route.kind == "chat" and chat.path_params == {}
    stored = TABLE.match(http("GET", "/v1/responses/resp_1"))
    assert stored.route is not None and stored.route.routing == "home"
    assert stored.path_params == {"response_id": "resp_1"}
    cancel = TABLE.match(http("POST", "/v1/responses/resp_1/cancel"))
    assert cancel.route is not None and cancel.path_params == {"response_id": "resp_1"}


def test_the_first_route_in_table_order_wins() -> None:
    # /v1/responses/render is a route of its own, not a stored response named "render"
    render = TABLE.match(http("POST", "/v1/responses/render"))
    assert render.route is not None and render.route.routing == "prefix"
    # ... but GET names a stored response (the render route takes POST only)
    named = TABLE.match(http("GET", "/v1/responses/render"))
    assert named.route is not None and named.path_params == {"response_id": "render"}


def test_another_method_on_a_routes_path_says_which_methods_it_takes() -> None:
    assert TABLE.match(http("GET", "/v1/chat/completions")).allow == ("POST",)
    assert TABLE.match(http("HEAD", "/v1/responses/resp_1")).allow == ("GET",)
    assert TABLE.match(http("POST", "/v1/responses/resp_1")).route is None


def test_a_path_one_slash_away_from_a_route_is_redirected_to_it() -> None:
    assert TABLE.match(http("POST", "/v1/chat/completions/")).redirect_path == \
        "/v1/chat/completions"
    assert TABLE.match(http("POST", "/tokenize//")).redirect_path == "/tokenize"
    assert TABLE.match(http("POST", "/v1/responses/resp_1/cancel/")).redirect_path == \
        "/v1/responses/resp_1/cancel"


def test_any_other_path_is_not_a_relayed_one() -> None:
    for method, path in [("GET", "/v1/models"), ("GET", "/health"), ("POST", "/v1/nowhere"),
                         ("GET", "/"), ("POST", "/v1/responses/a/b")]:
        match = TABLE.match(http(method, path))
        assert (match.route, match.allow, match.redirect_path) == (None, (), None), path


def test_routes_match_below_the_root_path() -> None:
    assert route_path(http("POST", "/api/v1/completions", root_path="/api")) == "/v1/completions"
    assert route_path(http("POST", "/apiv1/completions", root_path="/api")) == \
        "/apiv1/completions"
    match = TABLE.match(http("POST", "/api/v1/completions", root_path="/api"))
    assert match.route is not None and match.route.kind == "completions"
