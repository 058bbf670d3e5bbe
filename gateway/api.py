"""The OpenAI-compatible routes and the gateway's own health routes.

    POST /v1/chat/completions   routed, streaming or not
    POST /v1/completions        routed, streaming or not
    GET  /v1/models             models served by healthy replicas
    GET  /health                the gateway process is alive
    GET  /ready                 every configured model has a healthy replica
    GET  /metrics               Prometheus text
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.responses import Response

from .errors import BodyTooLarge, InvalidRequest, ModelNotFound
from .exchange import Exchange, Route
from .jsonresp import JSONResponse
from .schemas import ChatBody, CompletionBody
from .state import GatewayState

log = logging.getLogger("prefixgate.access")

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

    async def routed(request: Request, route: Route) -> Response:
        """read -> parse -> describe -> decide -> forward (which records)."""
        exchange = Exchange(request, route)
        raw = await read_body(request, state.settings.max_body_bytes)
        exchange.set_model(resolve_model(state, exchange.parse(raw)))
        state.observe_lint(exchange)
        try:
            exchange.request = await state.describe(exchange)
            exchange.decision = state.router.decide(exchange.request)
        except BaseException:
            if exchange.lint is not None:
                exchange.lint.cancel()
            raise
        return await state.proxy.forward(exchange)

    chat = Route("chat", "/v1/chat/completions", ChatBody)
    completion = Route("completions", "/v1/completions", CompletionBody)

    @router.post(chat.path)
    async def chat_completions(request: Request) -> Response:
        return await routed(request, chat)

    @router.post(completion.path)
    async def completions(request: Request) -> Response:
        return await routed(request, completion)

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
