"""An httpx transport into an ASGI app in this process that really streams.

``httpx.ASGITransport`` collects the whole body before it returns, which
would turn every streamed answer of an in-process engine into one late
chunk. This transport runs the app in a task, returns as soon as the app has
sent ``http.response.start``, and hands body chunks over through a queue as
the app sends them. Closing the response early (the gateway's client went
away) cancels the app's task, which is how vLLM notices a disconnect and
aborts the request.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx

ASGIApp = Callable[..., Any]
_END = object()


class StreamingASGITransport(httpx.AsyncBaseTransport):
    def __init__(self, app: ASGIApp, client: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.app = app
        self.client = client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = await request.aread()
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": request.method, "scheme": request.url.scheme,
            "path": request.url.path, "raw_path": request.url.raw_path.split(b"?")[0],
            "query_string": request.url.query, "root_path": "",
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": self.client, "server": (request.url.host, request.url.port or 80),
            "state": {},
        }
        queue: asyncio.Queue[Any] = asyncio.Queue()
        started: asyncio.Future[tuple[int, list[tuple[bytes, bytes]]]] = (
            asyncio.get_running_loop().create_future())
        disconnected = asyncio.Event()
        sent_body = False

        async def receive() -> dict[str, Any]:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                if not started.done():
                    started.set_result((message["status"], list(message.get("headers", []))))
            elif message["type"] == "http.response.body":
                chunk = message.get("body", b"")
                if chunk:
                    await queue.put(chunk)
                if not message.get("more_body", False):
                    await queue.put(_END)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            except BaseException as exc:
                if not started.done():
                    started.set_exception(exc if isinstance(exc, Exception) else
                                          RuntimeError("ASGI app cancelled"))
                await queue.put(exc)
                raise
            finally:
                if not started.done():
                    started.set_exception(RuntimeError("ASGI app sent no response"))
                await queue.put(_END)

        task = asyncio.create_task(run())
        try:
            status, headers = await started
        except BaseException:
            task.cancel()
            raise
        return httpx.Response(status, headers=headers,
                              stream=_QueueStream(queue, task, disconnected), request=request)


class _QueueStream(httpx.AsyncByteStream):
    def __init__(self, queue: asyncio.Queue[Any], task: asyncio.Task[None],
                 disconnected: asyncio.Event) -> None:
        self._queue = queue
        self._task = task
        self._disconnected = disconnected

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise httpx.ReadError(f"in-process app failed: {item!r}")
            yield item

    async def aclose(self) -> None:
        self._disconnected.set()
        if not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
