"""least_load: each request to the replica with the least outstanding work.

Algorithm: load = max(gateway in-flight, engine running) + engine waiting
(see :attr:`ReplicaView.load`); ties broken by KV usage, then by a rotating
offset so equal replicas share work instead of the first id taking it all.

Parameters: none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .base import healthy
from .options import parse_options
from .types import Decision, ReplicaView, RouteRequest


@dataclass(frozen=True)
class LeastLoadConfig:
    pass


class LeastLoad:
    name = "least_load"
    uses_prefix = False

    def __init__(self, config: LeastLoadConfig | None = None) -> None:
        self.config = config or LeastLoadConfig()
        self._tiebreak = 0

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> LeastLoad:
        return cls(parse_options(LeastLoadConfig, options, cls.name))

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

    def observe(self, request: RouteRequest, decision: Decision) -> None:
        return None

    def forget_replica(self, replica_id: str) -> None:
        return None

    def indexed_blocks(self, replica_id: str) -> int | None:
        return None

    def event_consumer(self) -> None:
        return None
