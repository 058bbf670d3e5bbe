"""round_robin: each request to the next healthy replica in id order.

Algorithm: keep a counter; the i-th request goes to ``healthy[i % n]`` where
``healthy`` is the healthy replicas sorted by id. Ignores prefixes and load.
It is the baseline every cache-aware policy is measured against.

Parameters: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import LoadOnly, healthy
from policies.types import Decision, ReplicaView, RouteRequest


class RoundRobin(LoadOnly):
    name = "round_robin"

    def __init__(self) -> None:
        self._counter = 0

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        candidates = sorted(healthy(replicas), key=lambda r: r.id)
        start = self._counter % len(candidates)
        self._counter += 1
        ordered = candidates[start:] + candidates[:start]
        return Decision(
            replica_id=ordered[0].id,
            reason="round-robin",
            fallbacks=tuple(r.id for r in ordered[1:]),
        )
