"""Offline replay of a request stream through a policy, and the ideal bound.

Algorithm: a discrete-event simulation in simulated time. Each item of the
stream is ``SimRequest(arrival, request, decode_tokens)``. At its arrival the
policy ``pick``s a replica from views built from the modeled replicas and is
told the request was ``sent`` there; when the replica has prefilled it (its
first token), the policy is told it was ``prefilled``, exactly as the gateway
does. Each replica models:

* a prefix cache: an LRU of block hashes with the replica's capacity in
  blocks (:class:`LruBlockCache`). When a request starts, the longest leading
  run of its blocks found in the cache is its hit; then all its blocks are
  touched last-to-first (shared prefixes stay freshest, as vLLM frees a
  request's blocks tail-first) and least-recently-used blocks are evicted;
* load: up to ``max_running`` requests run at once, the rest wait in FIFO
  order. The engine's prefill is one resource, as in a continuous-batching
  engine whose steps share one token budget: a started request's
  ``uncached_tokens * prefill_seconds_per_token`` of prefill begins when the
  prefill started before it has ended (its first token then), and its
  ``decode_tokens * decode_seconds_per_token`` of decode follows. Views report ``inflight`` =
  running + waiting, ``running``, ``waiting``, ``kv_usage`` = blocks of
  running requests / capacity, and the requests not yet prefilled with the
  prompt tokens the decision expected them to prefill (``pending_requests``,
  ``pending_prefill_tokens``), as the gateway's pool reports them.

When an ``event_sink`` is given (e.g. ``policy.event_consumer().apply_events``), each
replica publishes vLLM-shaped KV events — ``BlockStored`` for newly cached
blocks (engine hashes in a key space of their own; token ids taken from
``SimRequest.token_ids``; a salted request's block 0 carries its
``cache_salt``) and ``BlockRemoved`` for evictions — delivered
``event_delay_seconds`` later.

The result counts, per replica, requests and prompt tokens queried vs. found
in cache, and decisions per reason. :func:`ideal_bound` runs the same stream
through ONE cache holding all replicas' capacity combined (no load model): the
hit rate no routing can beat by much, the yardstick for benchmarks.

Everything is deterministic: same stream, same policy state, same result.
The policy must have been built with the :class:`ManualClock` passed here.

Parameters (:class:`SimSettings`):

* ``prefill_seconds_per_token`` (default 0.0001): modeled prefill speed.
* ``decode_seconds_per_token`` (default 0.02): modeled decode step.
* ``event_delay_seconds`` (default 0.05): KV-event delivery delay.
"""

from __future__ import annotations

import heapq
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from policies.base import Policy
from policies.events import BlockRemoved, BlockStored, EventBatch, KVEvent
from policies.lru import LRU
from policies.types import ReplicaView, RouteRequest

EventSink = Callable[[str, EventBatch], None]

# Simulated engines hash blocks into their own key space, like a real vLLM.
_ENGINE_HASH_MASK = 0x9E3779B97F4A7C15

_ARRIVE, _FINISH, _DELIVER, _PREFILLED = 0, 1, 2, 3


@dataclass(frozen=True, slots=True)
class SimRequest:
    arrival: float
    request: RouteRequest
    decode_tokens: int = 0
    token_ids: tuple[int, ...] | None = None
    """The prompt's token ids; needed only when KV events are published."""
    cache_salt: str | None = None
    """The request's ``cache_salt`` (its ``block_hashes`` seeded with it); the
    published ``BlockStored`` of its block 0 carries it, as vLLM's does."""


@dataclass(frozen=True, slots=True)
class ReplayReplica:
    id: str
    block_capacity: int
    max_running: int = 64


@dataclass(frozen=True, slots=True)
class SimSettings:
    prefill_seconds_per_token: float = 0.0001
    decode_seconds_per_token: float = 0.02
    event_delay_seconds: float = 0.05


@dataclass(frozen=True, slots=True)
class ReplayStats:
    requests: int
    hit_tokens: int
    query_tokens: int
    predicted_tokens: int = 0
    """Prompt tokens the decisions expected the replica to hold (cached or on their way)."""

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0


@dataclass(frozen=True)
class SimResult:
    replicas: dict[str, ReplayStats]
    reasons: dict[str, int]
    mean_ttft_seconds: float

    @property
    def hit_rate(self) -> float:
        hits = sum(s.hit_tokens for s in self.replicas.values())
        queries = sum(s.query_tokens for s in self.replicas.values())
        return hits / queries if queries else 0.0

    @property
    def predicted_hit_ratio(self) -> float:
        """Predicted over actual cached tokens (1.0: the decisions knew)."""
        hits = sum(s.hit_tokens for s in self.replicas.values())
        predicted = sum(s.predicted_tokens for s in self.replicas.values())
        return predicted / hits if hits else (1.0 if not predicted else float("inf"))

    @property
    def requests_by_replica(self) -> dict[str, int]:
        return {rid: s.requests for rid, s in self.replicas.items()}


class ManualClock:
    """A clock the simulation (or a test) sets by hand."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class LruBlockCache:
    """An engine's prefix cache reduced to a capacity-bounded LRU of block hashes."""

    def __init__(self, capacity_blocks: int) -> None:
        if capacity_blocks <= 0:
            raise ValueError("capacity_blocks must be positive")
        self.capacity_blocks = capacity_blocks
        self._blocks: LRU[int, None] = LRU(capacity_blocks)

    def cached_prefix(self, block_hashes: Sequence[int]) -> int:
        run = 0
        for block_hash in block_hashes:
            if block_hash not in self._blocks:
                break
            run += 1
        return run

    def admit(self, block_hashes: Sequence[int]) -> tuple[list[int], list[int]]:
        """Touch a request's blocks; returns (indexes newly stored, hashes evicted)."""
        blocks = self._blocks
        stored = [i for i, h in enumerate(block_hashes) if h not in blocks]
        evicted = []
        for block_hash in reversed(block_hashes):
            evicted += [gone for gone, _ in blocks.put(block_hash, None)]
        return stored, evicted

    def __len__(self) -> int:
        return len(self._blocks)


@dataclass
class _ReplicaState:
    spec: ReplayReplica
    cache: LruBlockCache
    running: dict[int, int] = field(default_factory=dict)  # item index -> blocks in use
    waiting: deque[int] = field(default_factory=deque)
    pending: dict[int, int] = field(default_factory=dict)  # item index -> expected uncached
    prefill_free_at: float = 0.0
    requests: int = 0
    hit_tokens: int = 0
    query_tokens: int = 0
    predicted_tokens: int = 0

    def view(self, block_size: int, now: float, seconds_per_token: float) -> ReplicaView:
        used = sum(self.running.values())
        # Prefill left: what the started requests have not computed yet (exactly, as the
        # gateway's drained estimate would have it), and the queued requests' whole.
        started = max(0.0, self.prefill_free_at - now) / seconds_per_token
        queued = sum(self.pending.get(i, 0) for i in self.waiting)
        return ReplicaView(
            id=self.spec.id,
            inflight=len(self.running) + len(self.waiting),
            running=len(self.running),
            waiting=len(self.waiting),
            kv_usage=min(1.0, used / self.spec.block_capacity),
            block_size=block_size,
            block_capacity=self.spec.block_capacity,
            pending_requests=len(self.pending),
            pending_prefill_tokens=int(started) + queued,
        )


def _engine_hash(our_hash: int) -> int:
    return our_hash ^ _ENGINE_HASH_MASK


def _kv_events(item: SimRequest, stored: list[int], evicted: list[int]) -> list[KVEvent]:
    """Events a vLLM engine would publish for this admission."""
    events: list[KVEvent] = []
    block_size = item.request.block_size
    hashes = item.request.block_hashes
    if item.token_ids is not None:
        runs: list[list[int]] = []
        for index in stored:
            if runs and runs[-1][-1] == index - 1:
                runs[-1].append(index)
            else:
                runs.append([index])
        for run in runs:
            first, last = run[0], run[-1]
            events.append(
                BlockStored(
                    block_hashes=tuple(_engine_hash(hashes[i]) for i in run),
                    parent_block_hash=None if first == 0 else _engine_hash(hashes[first - 1]),
                    token_ids=item.token_ids[first * block_size : (last + 1) * block_size],
                    block_size=block_size,
                    medium="GPU",
                    cache_salt=item.cache_salt if first == 0 else None,
                )
            )
    if evicted:
        events.append(
            BlockRemoved(block_hashes=tuple(_engine_hash(h) for h in evicted), medium="GPU")
        )
    return events


def simulate(
    policy: Policy,
    stream: Sequence[SimRequest],
    replicas: Sequence[ReplayReplica],
    clock: ManualClock,
    settings: SimSettings | None = None,
    event_sink: EventSink | None = None,
) -> SimResult:
    """Replay ``stream`` through ``policy`` over modeled ``replicas``."""
    settings = settings or SimSettings()
    states = {spec.id: _ReplicaState(spec, LruBlockCache(spec.block_capacity)) for spec in replicas}
    queue: list[tuple[float, int, int, int, str]] = []  # time, seq, kind, item, replica
    sequence = 0
    pending_events: dict[int, tuple[str, EventBatch]] = {}

    def push(time: float, kind: int, item_index: int, replica_id: str = "") -> None:
        nonlocal sequence
        heapq.heappush(queue, (time, sequence, kind, item_index, replica_id))
        sequence += 1

    for index, item in enumerate(stream):
        push(item.arrival, _ARRIVE, index)
    reasons: Counter[str] = Counter()
    ttft_total = 0.0
    batch_seq = 0

    def start_waiting(state: _ReplicaState, now: float) -> None:
        nonlocal ttft_total, batch_seq
        while state.waiting and len(state.running) < state.spec.max_running:
            item_index = state.waiting.popleft()
            item = stream[item_index]
            request = item.request
            prompt_tokens = request.prompt_tokens or len(request.block_hashes) * request.block_size
            matched = state.cache.cached_prefix(request.block_hashes)
            hit_tokens = min(prompt_tokens, matched * request.block_size)
            state.hit_tokens += hit_tokens
            state.query_tokens += prompt_tokens
            stored, evicted = state.cache.admit(request.block_hashes)
            prefill = (prompt_tokens - hit_tokens) * settings.prefill_seconds_per_token
            first_token = max(now, state.prefill_free_at) + prefill
            state.prefill_free_at = first_token
            ttft_total += first_token - item.arrival
            decode = item.decode_tokens * settings.decode_seconds_per_token
            state.running[item_index] = len(request.block_hashes)
            push(first_token, _PREFILLED, item_index, state.spec.id)
            push(first_token + decode, _FINISH, item_index, state.spec.id)
            if event_sink is not None:
                events = _kv_events(item, stored, evicted)
                if events:
                    batch = EventBatch(seq=batch_seq, timestamp=now, events=tuple(events))
                    pending_events[batch_seq] = (state.spec.id, batch)
                    push(now + settings.event_delay_seconds, _DELIVER, batch_seq)
                    batch_seq += 1

    while queue:
        now, _, kind, item_index, replica_id = heapq.heappop(queue)
        clock.now = now
        if kind == _ARRIVE:
            request = stream[item_index].request
            views = [state.view(request.block_size, now, settings.prefill_seconds_per_token)
                     for state in states.values()]
            decision = policy.pick(request, views)
            policy.sent(request, decision.replica_id)
            reasons[decision.reason] += 1
            state = states[decision.replica_id]
            state.requests += 1
            prompt_tokens = request.prompt_tokens or len(request.block_hashes) * request.block_size
            expected = decision.matched_blocks.get(decision.replica_id, 0) * request.block_size
            state.pending[item_index] = max(0, prompt_tokens - expected)
            state.predicted_tokens += min(prompt_tokens, expected)
            state.waiting.append(item_index)
            start_waiting(state, now)
        elif kind == _PREFILLED:
            state = states[replica_id]
            del state.pending[item_index]
            policy.prefilled(stream[item_index].request, replica_id)
        elif kind == _FINISH:
            state = states[replica_id]
            del state.running[item_index]
            start_waiting(state, now)
        else:
            target, batch = pending_events.pop(item_index)
            assert event_sink is not None
            event_sink(target, batch)

    return SimResult(
        replicas={
            rid: ReplayStats(s.requests, s.hit_tokens, s.query_tokens, s.predicted_tokens)
            for rid, s in states.items()
        },
        reasons=dict(sorted(reasons.items())),
        mean_ttft_seconds=ttft_total / len(stream) if stream else 0.0,
    )


def ideal_bound(stream: Sequence[SimRequest], replicas: Sequence[ReplayReplica]) -> float:
    """Token hit rate of one cache as large as all replicas' caches together."""
    cache = LruBlockCache(sum(spec.block_capacity for spec in replicas))
    hits = queries = 0
    for item in sorted(stream, key=lambda i: i.arrival):
        request = item.request
        prompt_tokens = request.prompt_tokens or len(request.block_hashes) * request.block_size
        hits += min(prompt_tokens, cache.cached_prefix(request.block_hashes) * request.block_size)
        queries += prompt_tokens
        cache.admit(request.block_hashes)
    return hits / queries if queries else 0.0
