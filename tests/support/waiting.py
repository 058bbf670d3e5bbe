"""Wait for a condition another process or task brings about, with a deadline.

``eventually`` (async) and ``wait_until`` (blocking) re-check a predicate
until it holds and fail with ``what`` when the deadline passes. They are for
conditions that offer no signal of their own (state inside another process,
a counter another task bumps); the short pause between checks only hands the
loop or CPU back, it never stands in for the condition. The timeout is a
guard against hanging, not a speed assertion.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

POLL_INTERVAL = 0.01


async def eventually(
    predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Return once ``predicate()`` is true; ``AssertionError`` after ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() >= deadline:
            raise AssertionError(f"{what}: not reached within {timeout}s")
        await asyncio.sleep(POLL_INTERVAL)


def wait_until(
    predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition"
) -> None:
    """Blocking form of :func:`eventually`, for tests without an event loop."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not reached within {timeout}s")
        time.sleep(POLL_INTERVAL)


async def eventually_async(
    predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "condition"
) -> None:
    """:func:`eventually` for a predicate that must await (an HTTP call, say)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() >= deadline:
            raise AssertionError(f"{what}: not reached within {timeout}s")
        await asyncio.sleep(POLL_INTERVAL)
