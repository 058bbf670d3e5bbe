"""Sample the gateway's metrics registry into :class:`OpsStats` on a fixed period.

The registry is the one source of the ops view (``gateway.ops.stats``): the
pool's probe loops keep the replicas' series current, the recorder the
gateway's own; this loop only collects the registry (no I/O) every
``interval`` seconds, and of it only the series the readings read
(``gateway.ops.worker_readings.READ_SERIES``): it runs on the serving loop.
``start`` takes the first sample at once, so the series at start-up are the
baseline of the "since start" figures. The loop is a task owned by the app's
lifespan and stops on ``aclose``.

With several workers (``--workers N``) the source is every worker's readings,
gathered by the supervisor's hub and added up (``merged``:
``gateway.fleet.local``, ``gateway.ops.worker_readings``), so
whichever worker answers the ops view shows the whole gateway; the page's
"now" is then the latest sample (at most ``interval`` old), and a sample the
hub cannot give is skipped (this worker's own series alone would read as a
fall of every total). A worker that restarts starts its counters at zero:
that one sample reads as a reset, as ``rate`` would.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry

from engine.pool.replicas import ReplicaPool
from engine.tasks import cancel
from gateway.ops.load import GatewayLoad
from gateway.ops.stats import OpsStats
from gateway.ops.worker_readings import Readings, local_readings

log = logging.getLogger("prefixgate.ops")


class OpsSampler:
    def __init__(self, pool: ReplicaPool, registry: CollectorRegistry, stats: OpsStats,
                 load: GatewayLoad | None = None,
                 merged: Callable[[], Awaitable[Readings | None]] | None = None) -> None:
        self.pool = pool
        self.registry = registry
        self.stats = stats
        self.load = load or GatewayLoad(stats.clock, stats.window)
        """The gateway's own load (``gateway.ops.load``), sampled with the replicas."""
        self.merged = merged
        """Every worker's readings added up (several workers), or None: this registry."""
        self._latest: Readings | None = None
        self._task: asyncio.Task[None] | None = None

    def readings(self) -> Readings:
        """The replicas' readings and the gateway's own, from one collection (with
        several workers: the latest sample of them all)."""
        if self.merged is not None and self._latest is not None:
            return self._latest
        return local_readings(self.registry, (replica.id for replica in self.pool))

    def _sample(self, readings: Readings | None = None) -> None:
        replicas, load = readings if readings is not None else self.readings()
        self._latest = replicas, load
        self.stats.sample(replicas)
        self.load.sample(load)

    async def _sample_merged(self) -> None:
        assert self.merged is not None
        readings = await self.merged()
        if readings is not None:  # else the hub did not answer: no sample, not a false fall
            self._sample(readings)

    def start(self) -> None:
        if self.merged is None:
            self._sample()
        self._task = asyncio.create_task(self._loop(), name="ops-sampler")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await cancel(task)

    async def _loop(self) -> None:
        wait = 0.0 if self.merged is not None else self.stats.interval
        while True:
            await asyncio.sleep(wait)
            wait = self.stats.interval
            try:
                if self.merged is not None:
                    await self._sample_merged()
                else:
                    self._sample()
            except Exception:  # a bad reading must not end the ops view for good
                log.exception("ops sample failed")
