"""The least a proxy can do, as a control for the overhead benchmark.

``python -m loadtest.null_proxy --port P --upstream URL`` serves every
``POST`` by sending the body to the same path on ``URL`` and relaying the
answer's bytes as they arrive; ``GET /health`` answers 200. Nothing is
parsed, rendered, routed or counted. It runs on the gateway's own server
stack (uvicorn with uvloop and httptools, one pooled aiohttp session
upstream), so "null proxy minus direct" is what the extra hop alone costs
on the machine, and "prefixgate minus null proxy" what prefixgate's own
work adds on top of it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import aiohttp
import uvicorn

PASSED = (b"content-type", b"x-request-id", b"authorization")


class NullProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.session: aiohttp.ClientSession | None = None

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["method"] != "POST":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        parts = []
        more = True
        while more:
            message = await receive()
            parts.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(parts)
        headers = {k.decode(): v.decode() for k, v in scope["headers"] if k in PASSED}
        assert self.session is not None
        async with self.session.post(self.upstream + scope["path"], data=body,
                                     headers=headers) as upstream:
            out = [(b"content-type", upstream.headers.get("content-type", "").encode())]
            await send({"type": "http.response.start", "status": upstream.status,
                        "headers": out})
            async for chunk in upstream.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async def _lifespan(self, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0),
                    auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.session is not None:
                    await self.session.close()
                await send({"type": "lifespan.shutdown.complete"})
                return


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.null_proxy")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    args = parser.parse_args(argv)
    uvicorn.run(NullProxy(args.upstream), host=args.host, port=args.port, log_level="warning",
                access_log=False, loop="auto", http="auto")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
