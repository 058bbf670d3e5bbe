"""Runs the load generator's coroutine on the fastest event loop available.

uvloop (installed with ``uvicorn[standard]``) roughly halves the event-loop
cost per streamed chunk compared with the default loop; on a 2-core machine
where the load generator competes with what it measures, that matters. The
standard loop is used when uvloop is missing. The choice is recorded in the
reports (:func:`loop_name`).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable
from typing import TypeVar

try:
    import uvloop
except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
    uvloop = None  # type: ignore[assignment]

T = TypeVar("T")


def loop_name() -> str:
    return "uvloop" if uvloop is not None else "asyncio"


def run(main: Callable[[], Awaitable[T]]) -> T:
    """Run ``main()`` to the end. A SIGTERM while it runs cancels it and ends the run
    as ``SystemExit`` (what ``loadtest.cli``'s handler raises outside the loop): raised
    from a signal handler inside the running loop, the exit could land in a callback
    that swallowed it, and the run went on with its replicas and routers (a killed
    comparison hung one time in three)."""
    factory = uvloop.new_event_loop if uvloop is not None else None
    terminated: list[int] = []

    async def guarded() -> T:
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        previous = signal.getsignal(signal.SIGTERM)

        def on_term() -> None:
            terminated.append(signal.SIGTERM)
            task.cancel()

        try:
            loop.add_signal_handler(signal.SIGTERM, on_term)
        except (NotImplementedError, RuntimeError, ValueError):  # not the main thread
            return await main()
        try:
            return await main()
        finally:
            loop.remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, previous)

    with asyncio.Runner(loop_factory=factory) as runner:
        try:
            return runner.run(guarded())
        except asyncio.CancelledError:
            if terminated:
                raise SystemExit(128 + signal.SIGTERM) from None
            raise
