"""How late the event loop runs what is due: the delay every request shares.

A task sleeps ``period`` seconds again and again and records by how much
each wake-up came late (``prefixgate_event_loop_lag_seconds``). Work that
holds the loop — parsing, rendering, relaying thousands of chunks — shows up
here as the time a request that just arrived waits before its handler runs,
which no per-request histogram can see.
"""

from __future__ import annotations

import asyncio

from prometheus_client import Histogram

from engine.tasks import cancel


class LoopLagProbe:
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
