"""A gateway that has begun to stop ends within its deadline, whatever hangs."""

from __future__ import annotations

import asyncio
import threading

import pytest
import uvicorn

from gateway.request.drain import Drain
from gateway.server import http


async def test_a_shutdown_that_hangs_after_the_drain_ends_the_process(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose shutdown hung after its drain served on, alone, once its supervisor
    was killed (and a second SIGTERM could not end it): past the drain, the graceful
    shutdown and a margin, the process ends itself."""
    monkeypatch.setattr(http, "GRACEFUL_SHUTDOWN", 0.05)
    monkeypatch.setattr(http, "SHUTDOWN_MARGIN", 0.05)
    monkeypatch.setattr(http, "CUT_SECONDS", 0.05)
    exited: list[int] = []
    done = threading.Event()

    def hard_exit(code: int) -> None:
        exited.append(code)
        done.set()

    async def app(scope: object, receive: object, send: object) -> None:
        return None

    server = http.GatewayServer(uvicorn.Config(app), Drain(0.05), hard_exit=hard_exit)
    server._loop = asyncio.get_running_loop()
    server.handle_exit(15, None)  # SIGTERM: the drain begins, and nothing else stops it
    assert await asyncio.to_thread(done.wait, 10)
    assert server.should_exit  # the drain had ended: what hung came after it
    assert exited == [1]
