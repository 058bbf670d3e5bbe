"""precise: route on what the replicas' KV caches really hold, from their events.

Algorithm: each vLLM replica publishes KV-cache events; the gateway feeds
them to :meth:`PrecisePolicy.apply_events`, which replays them into a
:class:`PreciseIndex` keyed by the gateway's own chain hashes (the stored
blocks' token ids are re-hashed, so the engine's hash algorithm does not
matter). ``pick`` matches the prompt's block hashes against that index and
ranks the healthy replicas with the shared scoring rule
(:mod:`policies.scoring`; by default the estimated time to first token).
``observe`` marks the routed blocks as *speculatively* present on the chosen
replica for a short TTL, so a burst of requests sharing a new prefix stays
together until the engine's events confirm the blocks.

Wiring (the gateway): for each replica, ``set_model(replica_id, model)``
once (the index derives the unsalted seed ``chain_seed(model, None)`` and,
for blocks vLLM stored for a salted request, ``chain_seed(model, salt)``),
then ``apply_events(replica_id, batch)`` for every decoded
:class:`EventBatch`; ``forget_replica`` when the replica goes unhealthy (its
blocks are dropped; seeds are kept). A replay gap the subscriber cannot fill
arrives as a synthetic ``AllBlocksCleared`` batch.

Parameters: every option of :class:`ScoringConfig` (see
:mod:`policies.scoring`), plus:

* ``speculative_ttl_seconds`` (default 2.0): how long routed blocks count as
  present without an event confirming them (0 disables speculation).
* ``max_blocks_per_replica`` (default 524_288): memory guard on the engine
  hash map of each replica (see :mod:`policies.precise_index`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .events import EventBatch, KVEvent
from .options import parse_options
from .precise_index import PreciseIndex
from .scoring import ScoringConfig, decide
from .sessions import SessionTable
from .types import Decision, ReplicaView, RouteRequest


@runtime_checkable
class KVEventConsumer(Protocol):
    """What a policy that learns from KV events offers the event subscriber."""

    def set_model(self, replica_id: str, model: str, lora_id: int | None = None) -> None: ...

    def set_seed(self, replica_id: str, seed: int, lora_id: int | None = None) -> None: ...

    def apply_events(self, replica_id: str, update: EventBatch | KVEvent) -> None: ...


@dataclass(frozen=True)
class PreciseConfig(ScoringConfig):
    speculative_ttl_seconds: float = 2.0
    max_blocks_per_replica: int = 524_288


class PrecisePolicy:
    name = "precise"
    uses_prefix = True
    knows_only_own_routing = False

    def __init__(self, config: PreciseConfig | None = None, *, clock: Callable[[], float]) -> None:
        self.config = config or PreciseConfig()
        self.clock = clock
        self.index = PreciseIndex(
            speculative_ttl_seconds=self.config.speculative_ttl_seconds,
            max_blocks_per_replica=self.config.max_blocks_per_replica,
        )
        self.sessions = SessionTable(
            ttl_seconds=self.config.session_ttl_seconds, max_sessions=self.config.max_sessions
        )
        self._requests = 0

    @classmethod
    def from_options(
        cls, options: Mapping[str, Any], *, clock: Callable[[], float]
    ) -> PrecisePolicy:
        return cls(parse_options(PreciseConfig, options, cls.name), clock=clock)

    def set_model(self, replica_id: str, model: str, lora_id: int | None = None) -> None:
        """The replica's model: its chains start at ``hashing.chain_seed(model, salt)``."""
        self.index.set_model(replica_id, model, lora_id)

    def set_seed(self, replica_id: str, seed: int, lora_id: int | None = None) -> None:
        """Only the unsalted chain seed (``chain_seed(model, None)``); see ``set_model``."""
        self.index.set_seed(replica_id, seed, lora_id)

    def apply_events(self, replica_id: str, update: EventBatch | KVEvent) -> None:
        """Feed one decoded KV-event batch (or a single event) from a replica."""
        self.index.apply(replica_id, update)

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        now = self.clock()
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
        """Speculate the blocks on ``decision.replica_id`` (pass the replica actually used)."""
        now = self.clock()
        self.index.speculate(decision.replica_id, request.block_hashes, now)
        if self.config.session_affinity and request.session_key is not None:
            self.sessions.remember(request.session_key, decision.replica_id, now)

    def forget_replica(self, replica_id: str) -> None:
        self.index.clear(replica_id)
        self.sessions.forget_replica(replica_id)
