"""A request's body, read whole and bounded (``max_body_bytes``): too large is a 413."""

from __future__ import annotations

from starlette.requests import Request

from gateway.errors import BodyTooLarge


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(f"request body is {declared} bytes; the limit is {limit} "
                           "(the gateway's max_body_bytes)")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"request body is over the limit of {limit} bytes "
                               "(the gateway's max_body_bytes)")
        chunks.append(chunk)
    return b"".join(chunks)
