"""The OpenAI generation routes of the simulator: chat (``engine.sim.chat_route``)
and completions (``engine.sim.completion_route``), on one router."""

from __future__ import annotations

from fastapi import APIRouter

from engine.sim.chat_route import build_chat_router
from engine.sim.completion_route import build_completion_router
from engine.sim.runtime import SimRuntime


def build_openai_router(runtime: SimRuntime) -> APIRouter:
    router = APIRouter()
    router.include_router(build_chat_router(runtime))
    router.include_router(build_completion_router(runtime))
    return router
