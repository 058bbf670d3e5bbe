"""How late the event loop runs what is due: the delay every request shares.

A timer fires every ``period`` seconds and records by how much
each wake-up came late (``prefixgate_event_loop_lag_seconds``). Work that
holds the loop — parsing, rendering, relaying thousands of chunks — shows up
here as the time a request that just arrived waits before its handler runs,
which no per-request histogram can see.

``GcPauses`` times each garbage collection (``gc.callbacks``) into
``prefixgate_gc_pause_seconds``: a collection of the oldest generation
walks every object the gateway holds and stops the loop meanwhile.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

from prometheus_client import Histogram


class LoopLagMeter:
    """A timer that re-arms itself every ``period`` and observes how late it fired.

    A plain callback on the loop's timer (``call_at``), not a task that sleeps (a
    future, a timer and a task step each time), every 100 ms: at 20 task wake-ups a
    second the probe was half of an idle gateway's CPU (about 3 of 6.7 ms a second on
    the 2-core box, where one wake-up of the process costs some 100 us). 600 samples
    a minute still give the minute's p99."""

    def __init__(self, histogram: Histogram, period: float = 0.1) -> None:
        self.histogram = histogram
        self.period = period
        self._observe = histogram.observe
        self._loop: asyncio.AbstractEventLoop | None = None
        self._handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._arm(self._loop.time() + self.period)

    async def aclose(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()

    def _arm(self, due: float) -> None:
        assert self._loop is not None
        self._handle = self._loop.call_at(due, self._fire, due)

    def _fire(self, due: float) -> None:
        assert self._loop is not None
        now = self._loop.time()
        self._observe(max(0.0, now - due))
        self._arm(now + self.period)


class GcPauses:
    def __init__(self, histogram: Histogram) -> None:
        self.by_generation = [histogram.labels(str(g)) for g in range(3)]
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.by_generation[info["generation"]].observe(time.perf_counter() - self._started)

    def start(self) -> None:
        gc.callbacks.append(self._callback)

    def stop(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
