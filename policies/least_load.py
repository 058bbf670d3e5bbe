"""least_load: each request to the replica with the least outstanding work.

Algorithm: load = max(gateway in-flight, engine running) + engine waiting
(see :attr:`ReplicaView.load`); ties broken by KV usage, then by a rotating
offset so equal replicas share work instead of the first id taking it all.

Parameters: none.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.base import LoadOnly, healthy
from policies.types import Decision, ReplicaView, RouteRequest


class LeastLoad(LoadOnly):
    name = "least_load"

    def __init__(self) -> None:
        self._tiebreak = 0

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        candidates = sorted(healthy(replicas), key=lambda r: r.id)
        n = len(candidates)
        offset = self._tiebreak % n
        self._tiebreak += 1
        ordered = sorted(
            range(n),
            key=lambda i: (candidates[i].load, candidates[i].kv_usage, (i - offset) % n),
        )
        ranked = [candidates[i] for i in ordered]
        return Decision(
            replica_id=ranked[0].id,
            reason="least-load",
            fallbacks=tuple(r.id for r in ranked[1:]),
            scores={r.id: float(r.load) for r in ranked},
        )
