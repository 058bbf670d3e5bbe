"""What start-up says about the replicas: ready, or waiting, and which cannot be reached.

After the pool's first probe of every replica, :meth:`ReplicaWatch.report`
logs one of

    prefixgate: serving on http://127.0.0.1:8000/v1, ready: 2 of 2 replica(s) answering, policy cache_aware
    prefixgate: serving on http://127.0.0.1:8000/v1, waiting for replicas: none of 2 answers yet

and, once for each replica that did not answer, why (``replica s1 at
http://10.0.0.7:8000 cannot be reached: connection refused; probing every
1s``). The pool's own lines follow the changes later (``replica s1 is
healthy`` on recovery, ``left rotation`` when one fails); while the gateway
was still waiting, the first replica that answers also logs "ready".

The app's start-up runs once the server holds its port (``gateway.server.http``
binds before it starts the app; ``prefixgate serve`` checks the port even
before the embedded replicas start), so "serving on" and "ready" are never
printed by a gateway that cannot listen.
"""

from __future__ import annotations

import logging

from engine.pool.replicas import ReplicaPool

log = logging.getLogger("prefixgate")


class ReplicaWatch:
    def __init__(self, pool: ReplicaPool, policy: str, url: str,
                 sources: tuple[str, ...] = ()) -> None:
        self.pool = pool
        self.policy = policy
        self.url = url
        self.sources = sources
        """The DNS names replicas come from (``replicas_from``)."""
        self.ready = False

    def _answering(self) -> int:
        return sum(1 for replica in self.pool if replica.healthy)

    def report(self) -> None:
        """Log the state after the first probe, then follow the first recovery."""
        for replica in self.pool:
            if not replica.healthy:
                log.warning("replica %s at %s cannot be reached: %s; probing every %gs",
                            replica.id, replica.spec.url, replica.last_error or "no answer",
                            self.pool.health_interval)
        if self._answering():
            self._ready()
        elif not len(self.pool):
            log.warning("serving on %s, waiting for replicas: none yet (%s resolves to no "
                        "address); requests get 503 with Retry-After until one answers",
                        self.url, ", ".join(self.sources) or "no replica configured")
        else:
            log.warning("serving on %s, waiting for replicas: none of %d answers "
                        "yet; requests get 503 with Retry-After until one does",
                        self.url, len(self.pool))
        self.pool.add_listener(self._changed)

    def _changed(self, replica_id: str, healthy: bool) -> None:
        if healthy and not self.ready:
            self._ready()

    def _ready(self) -> None:
        self.ready = True
        log.info("serving on %s, ready: %d of %d replica(s) answering, policy %s",
                 self.url, self._answering(), len(self.pool), self.policy)
