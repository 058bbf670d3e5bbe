"""Routing as recorded: each request to the replica the trace says served it.

Not a policy to deploy: a replay with it gives every simulated replica the
load the real one had, so what differs from the recorded run is the latency
model alone (``prefixgate replay --policy recorded``: how well a fit
describes the replicas). Replicas are the trace's own ids; requests recorded
without one go round robin.
"""

from __future__ import annotations

from collections.abc import Sequence

from gateway.replay.workload import Workload
from policies.base import LoadOnly
from policies.events import KVEventConsumer
from policies.types import Decision, ReplicaView, RouteRequest


class RecordedRouting(LoadOnly):
    name = "recorded"

    def __init__(self, replica_ids: Sequence[str], assigned: Sequence[str | None]) -> None:
        self.replica_ids = tuple(replica_ids)
        self._assigned = list(assigned)
        self._next = 0

    @classmethod
    def for_workload(cls, workload: Workload, replicas: int) -> RecordedRouting:
        items = workload.items
        recorded = sorted({item.replica for item in items if item.replica})
        ids = recorded or [f"r{i}" for i in range(replicas)]
        return cls(ids, [item.replica for item in items])

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        replica = self._assigned[int(request.request_id)]
        if replica is None:
            replica = self.replica_ids[self._next % len(self.replica_ids)]
            self._next += 1
        return Decision(replica_id=replica, reason="recorded")

    def event_consumer(self) -> KVEventConsumer | None:
        return None
