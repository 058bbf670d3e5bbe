"""The OpenAI-compatible routes and the gateway's own health routes.

    POST /v1/chat/completions   routed, streaming or not
    POST /v1/completions        routed, streaming or not
    GET  /v1/models             models served by healthy replicas
    GET  /health                the gateway process is alive
    GET  /ready                 every configured model has a healthy replica
    GET  /metrics               Prometheus text
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from .errors import BodyTooLarge, InvalidRequest, ModelNotFound
from .jsonresp import JSONResponse
from .proxy import Outcome
from .schemas import ChatBody, CompletionBody, Sampling, parse_json, validate
from .state import GatewayState

log = logging.getLogger("prefixgate.access")

T = TypeVar("T")


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body is {declared} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def after_request_leaves(work: Callable[[], Awaitable[T]]) -> T:
    """``work()``, begun one turn of the event loop late.

    Sending a request body, aiohttp on Python 3.11 queues a task of its own
    that writes it (3.12+ starts it eagerly). Work queued by the handler
    before it sends would run first and hold the request back; started from
    here it runs after the write.
    """
    await asyncio.sleep(0)
    return await work()


def resolve_model(state: GatewayState, requested: str | None) -> str:
    known = state.pool.known_models()
    if requested is None:
        if len(known) == 1:
            return known[0]
        raise InvalidRequest("model: field required", param="model")
    if requested not in known:
        raise ModelNotFound(f"The model `{requested}` does not exist.", param="model")
    return requested


def build_router(state: GatewayState) -> APIRouter:
    router = APIRouter()

    async def routed(request: Request, kind: str, path: str,
                     schema: type[Sampling]) -> Response:
        started = time.perf_counter()
        raw = await read_body(request, state.settings.max_body_bytes)
        data = parse_json(raw)
        body = validate(schema, data)
        model = resolve_model(state, body.model)
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        session_key = request.headers.get("x-session-id") or body.user
        # The prompt lint observes the request once it has left; it never holds
        # the first byte back (the header carries its count only when done).
        tenant = request.headers.get("authorization") or body.user
        lint = asyncio.ensure_future(after_request_leaves(
            lambda: state.lint_prefix(model, data, kind, tenant)))
        try:
            route_request = await state.describe(model, data, kind, session_key, request_id)
            decided = state.router.decide(route_request)
        except BaseException:
            lint.cancel()
            raise
        headers = {"x-request-id": request_id}
        for name in ("authorization", "traceparent", "tracestate"):
            if name in request.headers:
                headers[name] = request.headers[name]
        forward_body = raw if body.model else state.with_model(data, model)
        state.metrics.overhead_seconds.observe(time.perf_counter() - started)

        def finish(outcome: Outcome) -> None:
            state.record(model, decided, outcome, started)

        async def response_headers(replica_id: str) -> dict[str, str]:
            lint_warnings = lint.result() if lint.done() and not lint.cancelled() \
                and lint.exception() is None else None
            return {
                "x-prefixgate-replica": replica_id,
                "x-request-id": request_id,
                "x-prefixgate-matched-tokens": str(state.predicted_cached(decided, replica_id)),
                **({"x-prefixgate-lint": str(lint_warnings)} if lint_warnings is not None else {}),
            }

        return await state.proxy.forward(
            request, path, forward_body, decided.decision.order, bool(body.stream), headers,
            started, finish, response_headers)

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await routed(request, "chat", "/v1/chat/completions", ChatBody)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await routed(request, "completions", "/v1/completions", CompletionBody)

    @router.get("/v1/models")
    async def models() -> Response:
        created = int(state.started_at)
        data: list[dict[str, Any]] = [
            {"id": name, "object": "model", "created": created, "owned_by": "prefixgate",
             "root": name, "parent": None}
            for name in state.pool.healthy_models()
        ]
        return JSONResponse({"object": "list", "data": data})

    @router.get("/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok"})

    @router.get("/ready")
    async def ready() -> Response:
        models = state.expected_models()
        missing = [m for m in models if not any(r.healthy for r in state.pool.serving(m))]
        tokenizers = state.hashers.tokenizers()
        if not models or missing:
            return JSONResponse({"ready": False, "models_without_replica": missing or ["(none)"],
                                 "tokenizers": tokenizers}, status_code=503)
        return JSONResponse({"ready": True, "models": models, "tokenizers": tokenizers})

    @router.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return router
