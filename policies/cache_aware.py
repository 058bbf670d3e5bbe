"""The cache-aware policy: a prefix index and a scorer, ``prefix`` and ``precise`` alike.

Algorithm, per request:

1. ``pick``: the index says how many leading blocks of the prompt each
   healthy replica holds (``PrefixIndex.match``), and the pending prefixes
   how many are on their way there (:mod:`policies.pending`: prompts sent
   and not yet prefilled); a replica counts the larger of the two. With
   session affinity on, the session's last replica is looked up; the scorer
   (:mod:`policies.cost_scorer` by default, which also weighs each replica's
   outstanding prefill; :mod:`policies.threshold_scorer`) ranks the
   candidates within the bounded load (``load_factor`` below).
   Each replica's published KV capacity (``ReplicaView.block_capacity``) is
   noted for the index.
2. ``sent`` (each replica the request is sent to, failover included): the
   prompt's blocks are pending there.
3. ``prefilled`` (that replica's first token, or its whole answer): the
   blocks leave the pending set and the index records them
   (``PrefixIndex.record``; the precise index as speculative entries until
   the engine's events confirm them), takes any new capacity, and the
   session table remembers the replica. ``abandoned`` (failed or aborted
   before that): the blocks leave the pending set, nothing is learned.
4. ``forget_replica``: the replica went unhealthy; its index entries and
   sessions go (its pending prefixes leave with their own requests).
5. ``learn_remote``: what ``prefilled`` learns, published by another gateway
   instance (``gateway.fleet.sync``, shared routing state through Redis) or
   another worker of this gateway (``gateway.fleet.local``);
   ``learn_remote_pending``: a sibling worker's ``sent`` and ``abandoned``, so
   a burst split between workers follows one pending prefix.

Why pending and confirmed are two states: learning a prompt only when its
answer completes left a burst invisible (every request of a burst of one
new prefix was a miss, predictions a tenth of what the replicas served);
learning it as cached when it is sent piled conversations that share a
system prompt onto one replica (the prefix looked free where it was still
being computed). A pending prefix is matched, so predictions count what a
queued request will find, and its replica's outstanding prefill is priced,
so a burst spreads while the prefill is the bottleneck
(docs/benchmarks/bursts.md).

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
* ``load_factor`` (default 1.5; 0 turns the bound off) and ``load_floor``
  (default 8): bounded loads (:mod:`policies.bounded_load`). The scorer
  chooses among the replicas that, taking this request, stay within
  ``load_factor`` times the fleet's mean outstanding requests (rounded up),
  or within ``load_floor``, whichever is more; the others come last, as
  fallbacks. The cost model spreads a burst while its prefill is the
  bottleneck, but once one replica has confirmed a new prefix, it looks
  cheapest to every request that arrives after (a cached prefix outweighs
  dozens of running requests there), and a burst reaching the gateway
  slower than that prefill (a busy gateway, a slow client) piled onto it.
  The bound caps any burst, at any pace, near ``load_factor`` times the
  mean. The floor keeps it from touching light traffic, where the
  imbalance costs nothing and the cache affinity it would break costs a
  prefill: side by side on the shared-prefix benchmark a bound without a
  floor lost 5 to 10 points of hit rate (docs/benchmarks/bursts.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from policies.bounded_load import load_bound
from policies.cost_scorer import CostConfig, CostScorer
from policies.events import KVEventConsumer
from policies.index import PrefixIndex
from policies.options import parse_options
from policies.pending import PendingPrefixes
from policies.scoring import Candidates, Scorer
from policies.sessions import SessionTable
from policies.threshold_scorer import ThresholdConfig, ThresholdScorer
from policies.types import Decision, ReplicaView, RouteRequest


@dataclass(frozen=True)
class CacheAwareConfig:
    scorer: str = "cost"
    session_affinity: bool = False
    session_ttl_seconds: float = 600.0
    max_sessions: int = 100_000
    load_factor: float = 1.5
    load_floor: int = 8

    def __post_init__(self) -> None:
        if self.scorer not in SCORERS:
            raise ValueError(f"scorer must be one of {', '.join(SCORERS)}, not {self.scorer!r}")
        if self.session_ttl_seconds <= 0 or self.max_sessions <= 0:
            raise ValueError("session_ttl_seconds and max_sessions must be positive")
        if self.load_factor != 0 and self.load_factor < 1.0:
            raise ValueError("load_factor must be at least 1 (or 0: no bound)")
        if self.load_floor < 1:
            raise ValueError("load_floor must be at least 1")


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
        self.pending = PendingPrefixes()
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
        matched = self.index.match(request.block_hashes, now)
        on_their_way = self.pending.match(request.block_hashes)
        if on_their_way:
            matched = dict(matched)
            for replica_id, blocks in on_their_way.items():
                if blocks > matched.get(replica_id, 0):
                    matched[replica_id] = blocks
        candidates = Candidates.of(replicas, matched, session_replica, rotation)
        over = self._over_bound(candidates.replicas)
        if not over:
            return self.scorer.rank(request, candidates)
        within = [r for r in candidates.replicas if r.id not in over]
        decision = self.scorer.rank(request, Candidates.of(within, matched, session_replica,
                                                           rotation))
        reason = decision.reason
        if reason in ("hit", "miss") and max(candidates.matched.values()) > \
                candidates.matched[decision.replica_id]:
            reason = "load-fallback"
        return dataclasses.replace(decision, reason=reason,
                                   fallbacks=(*decision.fallbacks, *sorted(over)),
                                   matched_blocks=candidates.matched)

    def _over_bound(self, replicas: Sequence[ReplicaView]) -> set[str]:
        """The replicas that would be over the bounded load by taking one more."""
        factor = self.config.load_factor
        if not factor or len(replicas) < 2:
            return set()
        bound = max(load_bound(sum(r.load for r in replicas), len(replicas), factor),
                    self.config.load_floor)
        return {r.id for r in replicas if r.load + 1 > bound}

    def sent(self, request: RouteRequest, replica_id: str) -> None:
        self.pending.add(replica_id, request.block_hashes)

    def prefilled(self, request: RouteRequest, replica_id: str) -> None:
        self.pending.discard(replica_id, request.block_hashes)
        self.learn_remote(replica_id, request.block_hashes, request.session_key, self.clock())

    def abandoned(self, request: RouteRequest, replica_id: str) -> None:
        self.pending.discard(replica_id, request.block_hashes)

    def learn_remote(self, replica_id: str, block_hashes: Sequence[int],
                     session_key: str | None, now: float) -> None:
        """What ``prefilled`` learns, told by another gateway instance (or replayed from
        the shared snapshot) with the time it happened on this policy's clock."""
        reported = self._reported_capacity.pop(replica_id, None)
        if reported is not None:
            self.index.set_capacity(replica_id, reported)
        self.index.record(replica_id, block_hashes, now)
        if self.config.session_affinity and session_key is not None:
            self.sessions.remember(session_key, replica_id, now)

    def learn_remote_pending(self, replica_id: str, block_hashes: Sequence[int],
                             pending: bool) -> None:
        if pending:
            self.pending.add(replica_id, block_hashes)
        else:
            self.pending.discard(replica_id, block_hashes)

    def forget_replica(self, replica_id: str) -> None:
        # Pending prefixes stay: the requests on their way there are still in flight,
        # and each one's own ``prefilled`` or ``abandoned`` removes it.
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
