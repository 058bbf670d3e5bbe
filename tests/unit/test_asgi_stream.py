"""The in-process transport streams chunk by chunk and propagates disconnects."""

from __future__ import annotations

import asyncio

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from engine.backends.asgi_stream import StreamingASGITransport
from tests.support.waiting import eventually


def make_app(gate: asyncio.Event, cancelled: list[bool]) -> Starlette:
    async def stream(request: Request) -> StreamingResponse:
        async def body():
            try:
                yield b"data: first\n\n"
                await gate.wait()  # the client must see the first chunk before this
                yield b"data: second\n\n"
            except asyncio.CancelledError:
                cancelled.append(True)
                raise
        return StreamingResponse(body(), media_type="text/event-stream")

    async def echo(request: Request) -> JSONResponse:
        return JSONResponse({"got": (await request.json())["x"]}, status_code=201)

    return Starlette(routes=[Route("/stream", stream, methods=["POST"]),
                             Route("/echo", echo, methods=["POST"])])


async def test_first_chunk_arrives_before_the_app_finishes() -> None:
    gate, cancelled = asyncio.Event(), list[bool]()
    transport = StreamingASGITransport(make_app(gate, cancelled))
    async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
        async with client.stream("POST", "/stream", json={}) as response:
            chunks = response.aiter_bytes()
            assert await chunks.__anext__() == b"data: first\n\n"
            gate.set()
            assert await chunks.__anext__() == b"data: second\n\n"
        echo = await client.post("/echo", json={"x": 5})
    assert (echo.status_code, echo.json()) == (201, {"got": 5})


async def test_closing_early_cancels_the_app() -> None:
    gate, cancelled = asyncio.Event(), list[bool]()
    transport = StreamingASGITransport(make_app(gate, cancelled))
    async with (httpx.AsyncClient(transport=transport, base_url="http://engine") as client,
                client.stream("POST", "/stream", json={}) as response):
        await response.aiter_bytes().__anext__()
    await eventually(lambda: cancelled == [True], what="the app cancelled")
