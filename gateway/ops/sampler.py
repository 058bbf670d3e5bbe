"""Sample the gateway's metrics registry into :class:`OpsStats` on a fixed period.

The registry is the one source of the ops view (``gateway.ops.stats``): the
pool's probe loops keep the replicas' series current, the recorder the
gateway's own; this loop only collects the registry (no I/O) every
``interval`` seconds. ``start`` takes the first sample at once, so the
series at start-up are the baseline of the "since start" figures. The loop
is a task owned by the app's lifespan and stops on ``aclose``.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import CollectorRegistry

from engine.pool.replicas import ReplicaPool
from engine.tasks import cancel
from gateway.ops.load import GatewayLoad, LoadReading, read_load
from gateway.ops.stats import OpsStats, ReplicaReading, read_registry

log = logging.getLogger("prefixgate.ops")


class OpsSampler:
    def __init__(self, pool: ReplicaPool, registry: CollectorRegistry, stats: OpsStats,
                 load: GatewayLoad | None = None) -> None:
        self.pool = pool
        self.registry = registry
        self.stats = stats
        self.load = load or GatewayLoad(stats.clock, stats.window)
        """The gateway's own load (``gateway.ops.load``), sampled with the replicas."""
        self._task: asyncio.Task[None] | None = None

    def readings(self) -> tuple[list[ReplicaReading], LoadReading]:
        """The replicas' readings and the gateway's own, from one collection."""
        collected = list(self.registry.collect())
        return (read_registry(collected, (replica.id for replica in self.pool)),
                read_load(collected))

    def _sample(self) -> None:
        replicas, load = self.readings()
        self.stats.sample(replicas)
        self.load.sample(load)

    def start(self) -> None:
        self._sample()
        self._task = asyncio.create_task(self._loop(), name="ops-sampler")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await cancel(task)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.stats.interval)
            try:
                self._sample()
            except Exception:  # a bad reading must not end the ops view for good
                log.exception("ops sample failed")
