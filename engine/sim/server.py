"""The simulated vLLM OpenAI server as an ASGI app: ``create_sim_app(config)``.

Nothing happens at import time. ``create_sim_app`` builds one
:class:`~engine.sim.runtime.SimRuntime` and the routes that close over it;
the lifespan starts it (tokenizer, KV-event sockets, engine loop task) and
stops it cleanly. Every :class:`~engine.sim.protocol.SimError` raised by a
route is rendered once, here, as vLLM's OpenAI error JSON.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response

from engine.sim.admin_routes import build_admin_router
from engine.sim.anthropic_route import build_anthropic_router
from engine.sim.config import SimConfig
from engine.sim.openai_routes import build_openai_router
from engine.sim.pooling_routes import build_pooling_router
from engine.sim.protocol import SimError
from engine.sim.responses_api import build_responses_router
from engine.sim.runtime import SimRuntime


def create_sim_app(config: SimConfig) -> FastAPI:
    runtime = SimRuntime(config)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await runtime.start()
        # The tokenizer and modules loaded at start leave the cyclic collector's
        # sight, so a full collection does not stall every stream (as in the gateway).
        gc.collect()
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
            await runtime.stop()

    app = FastAPI(
        title="prefixgate sim (vLLM-compatible)", lifespan=lifespan, docs_url=None, redoc_url=None
    )
    app.state.sim_runtime = runtime  # for in-process tests and debugging only

    async def render_error(_: Request, exc: Exception) -> Response:
        assert isinstance(exc, SimError)
        return Response(
            orjson.dumps(exc.body()), status_code=exc.status, media_type="application/json"
        )

    app.add_exception_handler(SimError, render_error)
    app.include_router(build_openai_router(runtime))
    app.include_router(build_admin_router(runtime))
    app.include_router(build_responses_router(runtime))
    app.include_router(build_anthropic_router(runtime))
    app.include_router(build_pooling_router(runtime))
    return app
