"""How late the event loop runs what is due: the delay every request shares.

A task sleeps ``period`` seconds again and again and records by how much
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

from engine.tasks import cancel


class LoopLagMeter:
    def __init__(self, histogram: Histogram, period: float = 0.05) -> None:
        self.histogram = histogram
        self.period = period
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="loop-lag")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await cancel(task)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.period
            await asyncio.sleep(self.period)
            self.histogram.observe(max(0.0, loop.time() - due))


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
