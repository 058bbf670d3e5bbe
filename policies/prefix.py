"""prefix: route to the replica believed to hold the prompt's longest prefix.

Algorithm: the gateway remembers which KV blocks it sent to each replica
(:class:`ApproximatePrefixIndex`, an LRU per replica sized by that replica's
KV capacity and aged by a TTL). For a new request, ``pick`` matches the
prompt's chained block hashes against every healthy replica, then ranks
them with the shared scoring rule (:mod:`policies.scoring`; by default the
estimated time to first token: queue wait plus prefill of the uncached
tokens). ``observe`` records the routed blocks for the replica that got the
request, touching them so shared prefixes stay fresh. No engine cooperation
is needed; the price is that the index is a guess: blocks evicted by the
engine (or sent there by other clients) are only learned through the TTL and
the capacity bound.

Capacities: ``pick`` notes each replica's ``ReplicaView.block_capacity`` and
``observe`` resizes the index to it, so a pool that reports capacity needs no
extra wiring.

Parameters: every option of :class:`ScoringConfig` (see
:mod:`policies.scoring`: ``scorer`` = ``"cost"``, cost weights, threshold
rule, session affinity), plus:

* ``index_ttl_seconds`` (default 300.0): an index entry untouched this long
  no longer counts as cached.
* ``default_capacity_blocks`` (default 8192): index capacity of a replica
  whose real KV capacity is not known (``block_capacity`` 0).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .options import parse_options
from .prefix_index import ApproximatePrefixIndex
from .scoring import ScoringConfig, decide
from .sessions import SessionTable
from .types import Decision, ReplicaView, RouteRequest


@dataclass(frozen=True)
class PrefixConfig(ScoringConfig):
    index_ttl_seconds: float = 300.0
    default_capacity_blocks: int = 8192


class PrefixPolicy:
    name = "prefix"
    uses_prefix = True

    def __init__(self, config: PrefixConfig | None = None, *, clock: Callable[[], float]) -> None:
        self.config = config or PrefixConfig()
        self.clock = clock
        self.index = ApproximatePrefixIndex(
            ttl_seconds=self.config.index_ttl_seconds,
            default_capacity_blocks=self.config.default_capacity_blocks,
        )
        self.sessions = SessionTable(
            ttl_seconds=self.config.session_ttl_seconds, max_sessions=self.config.max_sessions
        )
        self._requests = 0
        self._reported_capacity: dict[str, int] = {}

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any], *, clock: Callable[[], float]
    ) -> PrefixPolicy:
        return cls(parse_options(PrefixConfig, options, cls.name), clock=clock)

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        now = self.clock()
        for view in replicas:
            if view.block_capacity > 0:
                self._reported_capacity[view.id] = view.block_capacity
        session_replica = None
        if self.config.session_affinity and request.session_key is not None:
            session_replica = self.sessions.get(request.session_key, now)
        rotation = self._requests
        self._requests += 1
        return decide(
            request,
            replicas,
            self.index.match(request.block_hashes, now),
            session_replica,
            self.config,
            rotation,
        )

    def observe(self, request: RouteRequest, decision: Decision) -> None:
        """Record the blocks for ``decision.replica_id`` (pass the replica actually used)."""
        now = self.clock()
        replica_id = decision.replica_id
        reported = self._reported_capacity.pop(replica_id, None)
        if reported is not None and reported != self.index.capacity(replica_id):
            self.index.set_capacity(replica_id, reported)
        self.index.record(replica_id, request.block_hashes, now)
        if self.config.session_affinity and request.session_key is not None:
            self.sessions.remember(request.session_key, replica_id, now)

    def forget_replica(self, replica_id: str) -> None:
        self.index.clear(replica_id)
        self.sessions.forget_replica(replica_id)
        self._reported_capacity.pop(replica_id, None)
