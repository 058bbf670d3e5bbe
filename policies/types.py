"""Typed values that cross the boundary between the gateway and a policy.

A policy sees only these: an immutable view of each replica taken before the
decision, and the request reduced to what routing needs (its KV-block hashes,
token count, optional session key). It answers with a :class:`Decision`. No
awaits, no I/O, no clock it was not handed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What the pool knows about one replica at the moment of the decision."""

    id: str
    healthy: bool = True
    inflight: int = 0
    """Requests the gateway has sent to this replica and not yet finished."""
    running: int = 0
    """Requests the engine runs, as best known now (``vllm:num_requests_running``: the
    pool counts other clients' as of its last scrape and the gateway's own as of now)."""
    waiting: int = 0
    """Requests the engine queues, as best known now (``vllm:num_requests_waiting``, the
    same way: the gateway's own not yet prefilled count as queued)."""
    kv_usage: float = 0.0
    """``vllm:kv_cache_usage_perc`` in [0, 1] from the last scrape."""
    block_size: int = 16
    block_capacity: int = 0
    """KV blocks the replica holds in total (0 when unknown)."""
    pending_requests: int = 0
    """Of ``inflight``, the requests whose prefill the replica has not confirmed yet
    (no first token): queued in the engine or prefilling."""
    pending_prefill_tokens: int = 0
    """The prompt tokens those requests must still prefill there, as the gateway
    predicted them (their uncached part): the work a new request queues behind."""
    prefilled_requests: int = 0
    """Of ``pending_requests``, those at the front of the queue whose prefill the
    estimate has drained whole (no tokens of theirs left in ``pending_prefill_tokens``):
    running by the gateway's estimate, though their first token has not come yet."""

    @property
    def load(self) -> int:
        """Outstanding requests: the gateway's in flight, or what the engine runs and
        queues when that is more (other clients). The gateway's in-flight requests
        include the ones the engine queues, so they are not added twice."""
        return max(self.inflight, self.running + self.waiting)

    @property
    def running_load(self) -> int:
        """Outstanding requests other than the engine's queue (``load - waiting``)."""
        return self.load - self.waiting


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """A request as routing sees it."""

    model: str
    block_hashes: tuple[int, ...] = ()
    """Chained hashes of the full KV blocks of the rendered prompt."""
    prompt_tokens: int = 0
    block_size: int = 16
    session_key: str | None = None
    """``x-session-id`` header or the OpenAI ``user`` field, when present."""
    request_id: str = ""
    output_tokens: int = 0
    """The answer's length limit the request sets (``max_tokens``...); 0 when none."""


@dataclass(frozen=True, slots=True)
class Decision:
    """The policy's answer: where to send the request, and why."""

    replica_id: str
    reason: str
    """Bounded label: e.g. ``hit``, ``miss``, ``load-fallback``, ``round-robin``."""
    fallbacks: tuple[str, ...] = ()
    """Other healthy replicas in preference order, tried before the first byte."""
    matched_blocks: Mapping[str, int] = field(default_factory=dict)
    """Blocks of the prompt each replica is believed to hold."""
    scores: Mapping[str, float] = field(default_factory=dict)

    @property
    def order(self) -> tuple[str, ...]:
        return (self.replica_id, *self.fallbacks)


class NoReplicaAvailable(Exception):
    """Raised by a policy when no healthy candidate is left."""
