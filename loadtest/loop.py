"""Runs the load generator's coroutine on the fastest event loop available.

uvloop (installed with ``uvicorn[standard]``) roughly halves the event-loop
cost per streamed chunk compared with the default loop; on a 2-core machine
where the load generator competes with what it measures, that matters. The
standard loop is used when uvloop is missing. The choice is recorded in the
reports (:func:`loop_name`).
"""

from __future__ import annotations

import asyncio
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
    factory = uvloop.new_event_loop if uvloop is not None else None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())  # type: ignore[arg-type]
