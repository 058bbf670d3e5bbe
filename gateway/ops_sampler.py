"""Feed the pool's view of every replica to :class:`OpsStats` on a fixed period.

The pool already scrapes each replica's ``/metrics`` on its own probe loop;
this loop only reads what the pool holds (no I/O), every ``interval``
seconds, and hands it to ``OpsStats.sample``. ``start`` takes the first
sample at once, so the replicas' counters at start-up are the baseline of
the "since start" figures. The loop is a task owned by the app's lifespan and
stops on ``aclose``.
"""

from __future__ import annotations

import asyncio
import logging

from engine.pool import ReplicaPool
from engine.tasks import cancel

from .ops_stats import OpsStats, ReplicaReading

log = logging.getLogger("prefixgate.ops")


def readings(pool: ReplicaPool) -> list[ReplicaReading]:
    return [
        ReplicaReading(
            replica_id=replica.id,
            healthy=replica.healthy,
            inflight=replica.inflight,
            running=replica.metrics.running,
            waiting=replica.metrics.waiting,
            kv_usage=replica.metrics.kv_usage,
            prefix_hits=replica.metrics.prefix_hits,
            prefix_queries=replica.metrics.prefix_queries,
        )
        for replica in pool
    ]


class OpsSampler:
    def __init__(self, pool: ReplicaPool, stats: OpsStats) -> None:
        self.pool = pool
        self.stats = stats
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.stats.sample(readings(self.pool))
        self._task = asyncio.create_task(self._loop(), name="ops-sampler")

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await cancel(task)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.stats.interval)
            try:
                self.stats.sample(readings(self.pool))
            except Exception:  # a bad reading must not end the ops view for good
                log.exception("ops sample failed")
