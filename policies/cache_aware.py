"""The cache-aware policy: a prefix index and a scorer, ``prefix`` and ``precise`` alike.

Algorithm, per request:

1. ``pick``: the index says how many leading blocks of the prompt each
   healthy replica holds (``PrefixIndex.match``); with session affinity on,
   the session's last replica is looked up; the scorer ranks the candidates
   (:mod:`policies.cost_scorer` by default, :mod:`policies.threshold_scorer`).
   Each replica's published KV capacity (``ReplicaView.block_capacity``) is
   noted for the index.
2. ``observe`` (the replica that really answered): the index records the
   prompt's blocks there (``PrefixIndex.record``), takes any new capacity,
   and the session table remembers the replica.
3. ``forget_replica``: the replica went unhealthy; its index entries and
   sessions go.
4. ``learn_remote``: what ``observe`` learns, published by another gateway
   instance (``gateway.fleet_sync``, shared routing state through Redis).

The two configuration names differ only in their index: ``prefix``
(:mod:`policies.prefix`, the gateway's own routing history) and ``precise``
(:mod:`policies.precise`, the replicas' KV events).

Options of both (``policy_options``), beside the index's own and the
scorer's own:

* ``scorer`` (default ``"cost"``): ``"cost"`` or ``"threshold"``.
* ``session_affinity`` (default false): prefer a session's last replica
  (``x-session-id`` or the OpenAI ``user`` field). Affinity earns its keep
  where the index is blind: after a gateway restart, across gateway
  instances, or for salted requests.
* ``session_ttl_seconds`` (default 600.0): a session idle this long is new.
* ``max_sessions`` (default 100_000): remembered sessions, LRU beyond.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .cost_scorer import CostConfig, CostScorer
from .events import KVEventConsumer
from .index import PrefixIndex
from .options import parse_options
from .scoring import Candidates, Scorer
from .sessions import SessionTable
from .threshold_scorer import ThresholdConfig, ThresholdScorer
from .types import Decision, ReplicaView, RouteRequest


@dataclass(frozen=True)
class CacheAwareConfig:
    scorer: str = "cost"
    session_affinity: bool = False
    session_ttl_seconds: float = 600.0
    max_sessions: int = 100_000

    def __post_init__(self) -> None:
        if self.scorer not in SCORERS:
            raise ValueError(f"scorer must be one of {', '.join(SCORERS)}, not {self.scorer!r}")
        if self.session_ttl_seconds <= 0 or self.max_sessions <= 0:
            raise ValueError("session_ttl_seconds and max_sessions must be positive")


SCORERS: dict[str, tuple[type, Callable[[Any], Scorer]]] = {
    "cost": (CostConfig, CostScorer),
    "threshold": (ThresholdConfig, ThresholdScorer),
}
"""Scorer name -> (its options dataclass, its class)."""


class CacheAwarePolicy:
    uses_prefix = True

    def __init__(self, name: str, index: PrefixIndex, scorer: Scorer,
                 config: CacheAwareConfig, *, clock: Callable[[], float],
                 events: KVEventConsumer | None = None) -> None:
        self.name = name
        self.index = index
        self.scorer = scorer
        self.config = config
        self.clock = clock
        self._events = events
        self.sessions = SessionTable(ttl_seconds=config.session_ttl_seconds,
                                     max_sessions=config.max_sessions)
        self._requests = 0
        self._reported_capacity: dict[str, int] = {}

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
        candidates = Candidates.of(replicas, self.index.match(request.block_hashes, now),
                                   session_replica, rotation)
        return self.scorer.rank(request, candidates)

    def observe(self, request: RouteRequest, decision: Decision) -> None:
        """Record the blocks for ``decision.replica_id`` (pass the replica actually used)."""
        self.learn_remote(decision.replica_id, request.block_hashes, request.session_key,
                          self.clock())

    def learn_remote(self, replica_id: str, block_hashes: Sequence[int],
                     session_key: str | None, now: float) -> None:
        """What ``observe`` learns, told by another gateway instance (or replayed from
        the shared snapshot) with the time it happened on this policy's clock."""
        reported = self._reported_capacity.pop(replica_id, None)
        if reported is not None:
            self.index.set_capacity(replica_id, reported)
        self.index.record(replica_id, block_hashes, now)
        if self.config.session_affinity and session_key is not None:
            self.sessions.remember(session_key, replica_id, now)

    def forget_replica(self, replica_id: str) -> None:
        self.index.forget_replica(replica_id)
        self.sessions.forget_replica(replica_id)
        self._reported_capacity.pop(replica_id, None)

    def indexed_blocks(self, replica_id: str) -> int | None:
        return self.index.size(replica_id)

    def event_consumer(self) -> KVEventConsumer | None:
        return self._events


@dataclass(frozen=True)
class ParsedOptions:
    policy: CacheAwareConfig
    index: Any
    """An instance of the ``index_config`` given to :func:`parse_options_of`."""
    scorer: Scorer


def parse_options_of(name: str, options: Mapping[str, Any], index_config: type) -> ParsedOptions:
    """Flat ``policy_options`` split among the parts that declare them (the policy, its
    index, its scorer), each parsed strictly; unknown options are errors."""
    scorer_name = str(options.get("scorer", CacheAwareConfig.scorer))
    if scorer_name not in SCORERS:
        raise ValueError(f"policy {name!r}: scorer must be one of {', '.join(SCORERS)}, "
                         f"not {scorer_name!r}")
    scorer_config, scorer_class = SCORERS[scorer_name]
    parts = (CacheAwareConfig, index_config, scorer_config)
    owner = {f.name: part for part in parts for f in dataclasses.fields(part)}
    unknown = sorted(set(options) - set(owner))
    if unknown:
        raise ValueError(f"policy {name!r} (scorer {scorer_name}): unknown option(s) "
                         f"{', '.join(unknown)}; known: {', '.join(sorted(owner))}")

    def part_of(part: type) -> Any:
        return parse_options(part, {k: v for k, v in options.items() if owner[k] is part}, name)

    return ParsedOptions(part_of(CacheAwareConfig), part_of(index_config),
                         scorer_class(part_of(scorer_config)))
