"""round_robin: each request to the next healthy replica in id order.

Algorithm: keep a counter; the i-th request goes to ``healthy[i % n]`` where
``healthy`` is the healthy replicas sorted by id. Ignores prefixes and load.
It is the baseline every cache-aware policy is measured against.

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
class RoundRobinConfig:
    pass


class RoundRobin:
    name = "round_robin"
    uses_prefix = False

    def __init__(self, config: RoundRobinConfig | None = None) -> None:
        self.config = config or RoundRobinConfig()
        self._counter = 0

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> RoundRobin:
        return cls(parse_options(RoundRobinConfig, options, cls.name))

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

    def observe(self, request: RouteRequest, decision: Decision) -> None:
        return None

    def forget_replica(self, replica_id: str) -> None:
        return None

    def indexed_blocks(self, replica_id: str) -> int | None:
        return None

    def event_consumer(self) -> None:
        return None
