"""The recorded trace's download.

    GET /admin/trace   the trace (``gateway.trace``) as JSON Lines, oldest line first

Admin keys only: ``/admin/*`` needs an admin key when client keys are on
(``gateway.auth.keys``), and this route also refuses a gateway without
client keys (403), where ``/admin/*`` is open to anyone who can reach it. The
trace holds no prompt text, but it is a record of every tenant's traffic:
when and how much each sent, and which requests shared a prefix. Without
client keys, read the file itself (``trace.path``). Trace off: 404.

The rotated files are sent oldest first, then the current one, each up to
its length when the download began (whole lines: the writer flushes first),
read in a worker thread, while recording goes on.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import APIRouter
from starlette.responses import Response, StreamingResponse

from gateway.errors import GatewayError, PermissionDenied
from gateway.trace.writer import TraceWriter

CHUNK_BYTES = 1 << 16


class TraceOff(GatewayError):
    status = 404
    type = "NotFoundError"
    code = "trace_off"


def trace_chunks(writer: TraceWriter) -> Iterator[bytes]:
    with writer.snapshot() as files:
        for handle, length in files:
            remaining = length
            while remaining > 0:
                chunk = handle.read(min(CHUNK_BYTES, remaining))
                if not chunk:
                    break
                remaining -= len(chunk)
                yield chunk


def build_trace_router(writer: TraceWriter | None, admin_keys: bool = False) -> APIRouter:
    """``admin_keys``: client keys are on, so every caller of ``/admin/*`` holds an admin
    key (``gateway.auth.keys``)."""
    router = APIRouter()

    @router.get("/admin/trace")
    async def admin_trace() -> Response:
        if writer is None:
            raise TraceOff("trace recording is off (set trace.path)")
        if not admin_keys:
            raise PermissionDenied("the trace needs an admin key (api_keys); without client "
                                   "keys, read the file trace.path")
        return StreamingResponse(
            trace_chunks(writer), media_type="application/x-ndjson",
            headers={"cache-control": "no-store",
                     "content-disposition": 'attachment; filename="trace.jsonl"'})

    return router
