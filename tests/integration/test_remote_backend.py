"""The remote backend's idle timeout between stream chunks, over a real socket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from engine.backend import Timeouts
from engine.errors import ReplicaTimeout
from engine.remote import RemoteBackend


async def streaming_server(pause_after: int, gap: float) -> tuple[web.AppRunner, str]:
    """Sends ``pause_after`` chunks ``gap`` seconds apart, then stalls for good."""

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for index in range(pause_after):
            await response.write(f"data: {index}\n\n".encode())
            await asyncio.sleep(gap)
        if pause_after >= 10:
            await response.write_eof()
            return response
        await asyncio.sleep(5)
        return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    runner = web.AppRunner(app, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def collect(chunks: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in chunks]


async def test_a_stalled_stream_times_out_after_the_idle_limit() -> None:
    runner, url = await streaming_server(pause_after=2, gap=0.05)
    backend = RemoteBackend("r", url, Timeouts(idle=0.4))
    try:
        upstream = await backend.send("/v1/chat/completions", b"{}", {})
        received: list[bytes] = []
        with pytest.raises(ReplicaTimeout, match="idle"):
            async with asyncio.timeout(5):  # the test's own guard: never hang
                async for chunk in upstream.chunks:
                    received.append(chunk)
        assert b"".join(received) == b"data: 0\n\ndata: 1\n\n"
        await upstream.close()
    finally:
        await backend.aclose()
        await runner.cleanup()


async def test_a_slow_but_steady_stream_is_not_cut() -> None:
    # 10 chunks 0.15 s apart: 1.5 s in all, three times the idle limit
    runner, url = await streaming_server(pause_after=10, gap=0.15)
    backend = RemoteBackend("r", url, Timeouts(idle=0.5))
    try:
        upstream = await backend.send("/v1/chat/completions", b"{}", {})
        chunks = await asyncio.wait_for(collect(upstream.chunks), 10)
        assert b"".join(chunks).count(b"data: ") == 10
        await upstream.close()
    finally:
        await backend.aclose()
        await runner.cleanup()
