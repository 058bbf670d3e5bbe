"""The gateway's own API routes (FastAPI), beside the relayed ones.

    GET  /v1/models             every healthy replica's model entries, merged by id
    GET  /v1/models/{model}     one of them (OpenAI's ``models.retrieve``)
    GET  /version               vLLM's version (the first healthy replica's), the
                                gateway's, and each replica's
    GET  /health                the gateway process is alive
    GET  /ready                 every configured model has a healthy replica
    GET  /metrics               Prometheus text

Any other path is a 404 in OpenAI's error shape (``gateway.errors``). The
relayed routes (vLLM's: ``gateway.server.vllm_routes``) never get here: the
front door serves them before FastAPI sees a request (``gateway.request.front``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from fastapi import APIRouter
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from engine.errors import EngineError
from gateway.errors import ModelNotFound
from gateway.jsonresp import JSONResponse
from gateway.ops.block_table import block_table_backend
from gateway.request.state import GatewayState
from gateway.version import gateway_version


def build_router(state: GatewayState) -> APIRouter:
    router = APIRouter()

    @router.get("/v1/models")
    async def models() -> Response:
        return JSONResponse({"object": "list", "data": model_cards(state)})

    @router.get("/v1/models/{model_id:path}")
    async def model(model_id: str, request: Request) -> Response:
        if not model_id:  # vLLM (starlette) redirects a trailing slash to the list
            return RedirectResponse(request.url.replace(path="/v1/models"), status_code=307)
        for card in model_cards(state):
            if card["id"] == model_id:
                return JSONResponse(card)
        raise ModelNotFound(f"The model `{model_id}` does not exist.", param="model")

    @router.get("/version")
    async def versions() -> Response:
        replicas = await replica_versions(state)
        first = next((v for v in replicas.values() if v is not None), None)
        return JSONResponse({"version": first, "prefixgate": gateway_version(),
                             "replicas": replicas})

    @router.get("/health")
    async def health() -> Response:
        return JSONResponse({"status": "ok"})

    @router.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        """vLLM's SageMaker health check: 200 (no body) while a replica can serve."""
        return Response(status_code=200 if any(r.healthy for r in state.pool) else 503)

    @router.get("/load")
    async def load() -> Response:
        """vLLM's ``{"server_load": n}``: the requests this gateway has at its replicas."""
        return JSONResponse({"server_load": sum(r.inflight for r in state.pool)})

    @router.get("/ready")
    async def ready() -> Response:
        models = state.expected_models()
        missing = [m for m in models if not any(r.healthy for r in state.pool.serving(m))]
        tokenizers = state.hashers.tokenizers()
        # Redis (shared routing state) is optional: it is reported, never a reason to be unready.
        redis = {"redis": state.redis_status()} if state.redis_status is not None else {}
        if state.workers is not None:  # which worker answered, and whether it hears the others
            redis["worker"] = state.workers.status()
        table = {"block_table": block_table_backend()}  # compiled, or the python fallback
        if not models or missing:
            return JSONResponse({"ready": False, "models_without_replica": missing or ["(none)"],
                                 "tokenizers": tokenizers, **table, **redis}, status_code=503)
        return JSONResponse({"ready": True, "models": models, "tokenizers": tokenizers,
                             **table, **redis})

    @router.get("/metrics")
    async def metrics() -> Response:
        merged = await state.workers.gather_metrics() if state.workers is not None else None
        return Response(merged if merged is not None else generate_latest(state.metrics.registry),
                        media_type=CONTENT_TYPE_LATEST)

    return router


def model_cards(state: GatewayState) -> list[dict[str, Any]]:
    """The healthy replicas' own ``/v1/models`` entries (``max_model_len``,
    ``permission``, ``owned_by``, ``root`` as vLLM sent them), one per model id; a
    model a healthy replica serves without having listed it gets a plain entry."""
    cards: list[dict[str, Any]] = [dict(card) for card in state.pool.model_cards()]
    listed = {card["id"] for card in cards}
    created = int(state.started_at)
    cards += [{"id": name, "object": "model", "created": created, "owned_by": "vllm",
               "root": name, "parent": None}
              for name in state.pool.healthy_models() if name not in listed]
    return cards


async def replica_versions(state: GatewayState) -> dict[str, str | None]:
    """Each replica's ``GET /version`` (None when it is out of rotation or cannot say)."""
    replicas = list(state.pool)

    async def ask(replica_id: str, healthy: bool) -> str | None:
        if not healthy:
            return None
        try:
            status, body = await state.pool.get(replica_id).backend.get("/version")
            answer = orjson.loads(body) if status == 200 else None
        except (EngineError, orjson.JSONDecodeError):
            return None
        found = answer.get("version") if isinstance(answer, dict) else None
        return found if isinstance(found, str) else None

    found = await asyncio.gather(*(ask(r.id, r.healthy) for r in replicas))
    return dict(zip((r.id for r in replicas), found))
