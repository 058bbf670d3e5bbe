"""Every error the gateway answers with, rendered in OpenAI's shape (or Anthropic's).

    GatewayError (status, type, code)       -> {"error": {message, type, param, code}}
    ├── InvalidRequest      400 invalid_request_error   bad JSON, schema, render
    ├── Unauthenticated     401 AuthenticationError     missing or unknown client key
    ├── PermissionDenied    403 PermissionDeniedError   admin route, key not admin
    ├── ModelNotFound       404 NotFoundError           model not served
    ├── BodyTooLarge        413 invalid_request_error   body over the limit
    ├── RateLimited         429 RateLimitError          a per-key limit (with Retry-After)
    ├── NoHealthyReplica    503 ServiceUnavailableError (with Retry-After)
    └── UpstreamFailed      502 / 504                   every replica tried failed

On vLLM's Anthropic Messages API routes (``Route.errors == "anthropic"``) they
are rendered as vLLM renders that API's errors, ``{"type": "error", "error":
{type, message}}``, but for ``InvalidRequest`` (a body that cannot be read,
which vLLM's request validation answers in OpenAI's shape on every route).

An error a replica answers with is not a GatewayError: its status and body
are passed through unchanged. Engine errors (``engine.errors``) are turned
into these in one place, the proxy. ``handlers`` renders them for the
gateway's own routes (FastAPI), with FastAPI's validation errors and
anything unexpected (a 500 in the same JSON shape, never an HTML page); the
front door renders the relayed routes' with the same functions
(``gateway.request.front``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fastapi import Request
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import Response
from starlette.types import ExceptionHandler

from gateway.jsonresp import JSONResponse

log = logging.getLogger("prefixgate.errors")


class GatewayError(Exception):
    status = 500
    type = "InternalServerError"
    # A string as OpenAI sends; a number where vLLM sends its status (ResponseNotFound).
    code: str | int | None = None

    def __init__(self, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.headers = headers or {}


class InvalidRequest(GatewayError):
    status = 400
    type = "BadRequestError"
    code = "invalid_request_error"


class Unauthenticated(GatewayError):
    status = 401
    type = "AuthenticationError"
    code = "invalid_api_key"


class MissingKey(Unauthenticated):
    code = "missing_api_key"


class PermissionDenied(GatewayError):
    status = 403
    type = "PermissionDeniedError"
    code = "permission_denied"


class RateLimited(GatewayError):
    status = 429
    type = "RateLimitError"
    code = "rate_limit_exceeded"


class ModelNotFound(GatewayError):
    """vLLM's own 404 for a model it does not serve (the code its status, as vLLM's)."""

    status = 404
    type = "NotFoundError"
    code = 404


class ResponseNotFound(GatewayError):
    """A stored response the caller may not see: vLLM's own 404 for an unknown id."""

    status = 404
    type = "invalid_request_error"
    code = 404

    def __init__(self, response_id: str) -> None:
        super().__init__(f"Response with id '{response_id}' not found.", param="response_id")


class BodyTooLarge(GatewayError):
    status = 413
    type = "BadRequestError"
    code = "request_too_large"


class NoHealthyReplica(GatewayError):
    status = 503
    type = "ServiceUnavailableError"
    code = "no_healthy_replica"


class UpstreamFailed(GatewayError):
    status = 502
    type = "BadGatewayError"
    code = "upstream_failed"


class UpstreamTimeout(UpstreamFailed):
    status = 504
    type = "GatewayTimeoutError"
    code = "upstream_timeout"


def error_body(status: int, message: str, type_: str, param: str | None = None,
               code: str | int | None = None) -> dict[str, object]:
    return {"error": {"message": message, "type": type_, "param": param,
                      "code": code if code is not None else status}}


def anthropic_error_body(message: str, type_: str) -> dict[str, object]:
    """An error as vLLM's Anthropic Messages API answers it (``translate_error_response``
    in ``vllm/entrypoints/anthropic/api_router.py``): ``{"type": "error", "error": {type,
    message}}``, the type the name vLLM gives the error (``NotFoundError``...)."""
    return {"type": "error", "error": {"type": type_, "message": message}}


def error_response(exc: GatewayError, anthropic: bool = False) -> JSONResponse:
    """``anthropic``: the request came to an Anthropic Messages API route, where vLLM
    answers its errors in Anthropic's shape, but for a body it cannot read (its request
    validation answers those in OpenAI's on every route): so does the gateway."""
    if anthropic and not isinstance(exc, InvalidRequest):
        body = anthropic_error_body(exc.message, exc.type)
    else:
        body = error_body(exc.status, exc.message, exc.type, exc.param, exc.code)
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


_STATUS_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 403: "PermissionDeniedError",
                 404: "NotFoundError", 405: "MethodNotAllowed", 413: "BadRequestError",
                 422: "BadRequestError", 429: "RateLimitError"}


def unexpected_error(path: str) -> JSONResponse:
    """The 500 for an exception no handler expected, logged with its traceback (call it
    while the exception is handled)."""
    log.exception("unexpected error on %s", path)
    return JSONResponse(
        error_body(500, "internal gateway error", "InternalServerError"), status_code=500
    )


def method_not_allowed(allow: Sequence[str]) -> JSONResponse:
    """A path the gateway serves, with a method it does not take (as starlette answers)."""
    return JSONResponse(error_body(405, "Method Not Allowed", _STATUS_TYPES[405]),
                        status_code=405, headers={"allow": ", ".join(allow)})


def handlers() -> dict[int | type[Exception], ExceptionHandler]:
    """FastAPI's ``exception_handlers`` for the gateway's own routes: gateway errors,
    FastAPI's validation errors and starlette's (404, 405), a client that left, and
    anything unexpected (a 500 in the same JSON shape, never an HTML page)."""

    async def on_gateway_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, GatewayError)
        return error_response(exc)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        status = 400 if exc.status_code == 422 else exc.status_code
        return JSONResponse(
            error_body(status, str(exc.detail), _STATUS_TYPES.get(status, "APIError")),
            status_code=status,
            headers=getattr(exc, "headers", None),
        )

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        return unexpected_error(request.url.path)

    async def on_client_gone(request: Request, exc: Exception) -> Response:
        # The client left while its body was read (or the server cut a slow body
        # with a 408): nobody is there to answer, and it is no gateway fault.
        return Response(status_code=499)

    return {GatewayError: on_gateway_error, StarletteHTTPException: on_http,
            ClientDisconnect: on_client_gone, Exception: on_unexpected}
