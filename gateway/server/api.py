"""The gateway's own routes, as one FastAPI app.

    gateway.server.routes        /v1/models, /version, /health, /ready, /metrics
    gateway.ops.routes           /admin/replicas, /dashboard
    gateway.server.lint_routes   /v1/prompt/lint, /admin/drift, /admin/lint
    gateway.server.trace_routes  /admin/trace

The relayed routes (vLLM's) are the front door's (``gateway.request.front``):
this app sees a request only when no relayed route matched it.
``/openapi.json`` documents both (``gateway.server.openapi``); errors are
OpenAI-shaped JSON (``gateway.errors``).
"""

from __future__ import annotations

from fastapi import FastAPI

from gateway import errors
from gateway.lint.service import LintService
from gateway.ops.routes import build_ops_router
from gateway.ops.view import OpsView
from gateway.request.state import GatewayState
from gateway.server.lint_routes import GroupSource, build_lint_router
from gateway.server.openapi import DocumentedApi
from gateway.server.routes import build_router
from gateway.server.trace_routes import build_trace_router
from gateway.server.vllm_routes import ROUTES
from gateway.trace.writer import TraceWriter


def build_api(state: GatewayState, ops_view: OpsView, lint: LintService,
              trace_writer: TraceWriter | None, admin_keys: bool,
              lint_groups: GroupSource | None = None) -> FastAPI:
    """``admin_keys``: client keys are on, so every ``/admin/*`` caller holds an admin key."""
    api = DocumentedApi(ROUTES, title="prefixgate", docs_url=None, redoc_url=None,
                        openapi_url="/openapi.json", exception_handlers=errors.handlers())
    api.include_router(build_router(state))
    api.include_router(build_ops_router(ops_view))
    api.include_router(build_lint_router(state, lint, admin_keys, lint_groups))
    api.include_router(build_trace_router(trace_writer, admin_keys))
    return api
