"""The operator's routes.

    GET /admin/replicas   every replica's health, load, cache and hit rates (JSON)
    GET /dashboard        one self-contained page that polls /admin/replicas

The page ships in the package (``gateway/ops/static/dashboard.html``) and is read
once when the router is built. It loads nothing from anywhere else; the
Content-Security-Policy header makes the browser hold it to that.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from starlette.responses import Response

from gateway.jsonresp import JSONResponse
from gateway.ops.view import OpsView

_PAGE_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'"),
    "cache-control": "no-cache",
    "x-content-type-options": "nosniff",
}


def dashboard_page() -> bytes:
    return (resources.files("gateway.ops") / "static" / "dashboard.html").read_bytes()


def build_ops_router(view: OpsView) -> APIRouter:
    router = APIRouter()
    page = dashboard_page()

    @router.get("/admin/replicas")
    async def admin_replicas() -> Response:
        return JSONResponse(view.payload(), headers={"cache-control": "no-store"})

    @router.get("/dashboard")
    async def dashboard() -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=_PAGE_HEADERS)

    return router
