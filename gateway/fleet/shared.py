"""What every sharing of routing state does, whatever carries it.

Two carriers share one instance's routing state with others: Redis between
gateway instances (``gateway.fleet.sync``) and the local hub between the
worker processes of one gateway (``gateway.fleet.local``, ``prefixgate
serve --workers N``). Both move the same batches (``gateway.fleet.codec``),
and both do the same on either side of the wire, here:

* **Out.** :meth:`SharedRouting.routed` queues what the policy learned (no
  I/O on the request's path; a full queue drops and counts); the carrier's
  publish loop takes batches (:meth:`SharedRouting._take`), with this
  instance's in-flight requests per replica when they changed and as a
  heartbeat (:meth:`SharedRouting._load_due`). Nothing polls: the loop
  wakes for queued entries, ``load_tick_seconds`` after a lease changed the
  in-flight counts (``ReplicaPool.on_inflight``), and twice a heartbeat;
  an instance without requests wakes twice a second.
* **In.** A batch of another instance teaches the policy
  (``Policy.learn_remote``) for replicas this instance knows and finds
  healthy; in-flight gauges are summed over the instances heard from within
  ``load_ttl_seconds`` and added to the load the policy sees
  (``ReplicaPool.set_remote_inflight``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.pool.replicas import ReplicaPool
from gateway.fleet.codec import Entry, Load, Pending, Routed, Snapshot
from gateway.fleet.journal import Journal
from policies.base import Policy
from policies.types import RouteRequest


@dataclass(frozen=True)
class FleetOptions:
    flush_seconds: float = 0.005
    batch_entries: int = 256
    queue_entries: int = 10_000
    stream_maxlen: int = 20_000
    load_tick_seconds: float = 0.05
    heartbeat_seconds: float = 1.0
    load_ttl_seconds: float = 3.0
    snapshot_seconds: float = 5.0
    snapshot_ttl_seconds: float = 600.0
    snapshot_blocks_per_replica: int = 16_384
    read_block_ms: int = 500
    read_count: int = 512
    socket_timeout_seconds: float = 2.0
    backoff_initial_seconds: float = 0.1
    backoff_max_seconds: float = 5.0
    startup_sync_seconds: float = 3.0


REDIS_OPTIONS = FleetOptions()
"""Between gateway instances, through Redis (``gateway.fleet.sync``)."""


class SharedRouting:
    """One instance's side of shared routing state; a carrier subclasses it and
    supplies ``_send`` (one batch to the others) and the reading."""

    shares_pending = False
    """Whether requests on their way (``sent``, ``abandoned``) travel too: between one
    gateway's workers, a millisecond apart; not through Redis, where a batch is 5 ms and
    a round trip behind, and older instances would not read the entry."""
    send_errors: tuple[type[BaseException], ...] = (OSError,)
    """What a failed ``_send`` raises: the batch is dropped and counted, the carrier down."""

    def __init__(self, instance: str, pool: ReplicaPool, policy: Policy, *,
                 options: FleetOptions, clock: Callable[[], float] = time.monotonic,
                 journal: Journal | None = None) -> None:
        self.instance = instance
        self.pool = pool
        self.policy = policy
        self.options = options
        self.clock = clock
        self.journal = journal
        """What was learned, kept for a snapshot (Redis); None where the other side keeps it."""
        self.up = False
        self.published = self.dropped = self.applied = self.bad_entries = 0
        self._pending: deque[Routed | Pending] = deque()
        self._remote_pending: dict[str, dict[tuple[str, tuple[int, ...]], deque[int]]] = {}
        """Per other instance, its requests on their way to a replica (``shares_pending``):
        their tickets in the replica's prefill queue, by replica and blocks."""
        self._wake = asyncio.Event()
        self._remote_load: dict[str, tuple[dict[str, int], float]] = {}
        self._sent_load: dict[str, int] | None = None
        self._sent_load_at = 0.0
        self._load_tick: asyncio.TimerHandle | None = None

    def watch_inflight(self) -> None:
        """Tell the others of this instance's in-flight requests as leases change them
        (the carrier that shares the routing state: one per pool)."""
        self.pool.on_inflight = self._arm_load_tick

    # -- the request path: never awaits ------------------------------------------

    def routed(self, request: RouteRequest, replica_id: str) -> None:
        """Queue what the policy just learned for publishing (``FleetPublisher``)."""
        if not request.block_hashes and request.session_key is None:
            return  # a load-only policy's request: nothing to share
        self._queue(Routed(replica_id, request.block_hashes, request.session_key))

    def sent(self, request: RouteRequest, replica_id: str, tokens: int) -> None:
        """A request with ``tokens`` to prefill is on its way to ``replica_id`` (with
        ``shares_pending``)."""
        if self.shares_pending and request.block_hashes:
            self._queue(Pending(replica_id, request.block_hashes, True, tokens))

    def abandoned(self, request: RouteRequest, replica_id: str) -> None:
        """It failed or was aborted there before its first token."""
        if self.shares_pending and request.block_hashes:
            self._queue(Pending(replica_id, request.block_hashes, False))

    def _queue(self, entry: Routed | Pending) -> None:
        if len(self._pending) >= self.options.queue_entries:
            self.dropped += 1
            return
        self._pending.append(entry)
        if len(self._pending) == 1 or len(self._pending) >= self.options.batch_entries:
            self._wake.set()

    def remote_inflight(self) -> dict[str, int]:
        """Other live instances' in-flight requests per replica."""
        total: Counter[str] = Counter()
        for counts, _ in self._remote_load.values():
            total.update(counts)
        return dict(total)

    def peers(self) -> int:
        return len(self._remote_load)

    # -- publishing --------------------------------------------------------------

    async def _send(self, batch: list[Entry]) -> None:
        raise NotImplementedError

    async def _after_publish(self, now: float) -> None:
        """What the carrier does once the queue is drained (Redis: the snapshot)."""

    def _arm_load_tick(self) -> None:
        """A lease started or ended: ``load_tick_seconds`` later the count goes out, unless
        it went meanwhile (once armed, later changes ride on the same tick)."""
        if self._load_tick is not None or not self.up:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a lease outside the serving loop: the heartbeat tells
            return
        self._load_tick = loop.call_later(self.options.load_tick_seconds, self._on_load_tick)

    def _on_load_tick(self) -> None:
        self._load_tick = None
        if self._own_inflight() != self._sent_load:
            self._wake.set()

    def _stop_load_tick(self) -> None:
        if self._load_tick is not None:
            self._load_tick.cancel()
            self._load_tick = None

    async def _publish_loop(self) -> None:
        options = self.options
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), options.heartbeat_seconds / 2)
            self._wake.clear()
            if self._pending and len(self._pending) < options.batch_entries:
                await asyncio.sleep(options.flush_seconds)
            now = self.clock()
            self._expire_remote(now)
            while self._pending or self._load_due(now):
                await self._publish(self._take(now), now)
            await self._after_publish(now)

    def _take(self, now: float) -> list[Entry]:
        batch: list[Entry] = []
        while self._pending and len(batch) < self.options.batch_entries:
            entry = self._pending.popleft()
            if self.journal is not None and isinstance(entry, Routed):
                self.journal.routed(entry.replica_id, entry.block_hashes, entry.session_key,
                                    now)
            batch.append(entry)
        if self._load_due(now):
            batch.append(Load(self._own_inflight()))
        return batch

    def _own_inflight(self) -> dict[str, int]:
        return {replica.id: replica.inflight for replica in self.pool if replica.inflight}

    def _load_due(self, now: float) -> bool:
        return self.up and (self._own_inflight() != self._sent_load
                            or now - self._sent_load_at >= self.options.heartbeat_seconds)

    async def _publish(self, batch: list[Entry], now: float) -> None:
        if not self.up:  # the reader is reconnecting (the journal, if any, kept the entries)
            self.dropped += sum(isinstance(entry, Routed) for entry in batch)
            return
        try:
            await self._send(batch)
        except self.send_errors as exc:
            self.dropped += sum(isinstance(entry, Routed) for entry in batch)
            self._set_up(False, exc)
            return
        self.published += sum(isinstance(entry, Routed) for entry in batch)
        for entry in batch:
            if isinstance(entry, Load):
                self._sent_load, self._sent_load_at = entry.inflight, now

    def _set_up(self, up: bool, error: BaseException | None) -> None:
        self.up = up
        if not up:
            self._forget_remote_load()

    def _forget_remote_load(self) -> None:
        for instance in list(self._remote_pending):
            self._settle_all(instance)
        if self._remote_load:
            self._remote_load.clear()
            self.pool.set_remote_inflight({})

    # -- applying ----------------------------------------------------------------

    def _learn_snapshot(self, snapshot: Snapshot, behind: float) -> None:
        """What the others learned before this instance listened, ``behind`` seconds old."""
        now = self.clock()
        for replica_id, runs in snapshot.replicas.items():
            if self._serves(replica_id):
                for run in runs:
                    self._learn(replica_id, run.block_hashes, None, now - behind - run.age)
        for session_key, replica_id, age in snapshot.sessions:
            if self._serves(replica_id):
                self._learn(replica_id, (), session_key, now - behind - age)

    def _apply_batch(self, instance: str, entries: tuple[Entry, ...],
                     live: bool) -> None:
        now = self.clock()
        for entry in entries:
            if isinstance(entry, Load):
                if live:  # a gauge read from the backlog is stale
                    self._remote_load[instance] = (entry.inflight, now)
                    self.pool.set_remote_inflight(self.remote_inflight())
                if not entry.inflight:  # nothing of it in flight: nothing on its way
                    self._settle_all(instance)
            elif isinstance(entry, Pending):
                if entry.on_its_way:
                    if live:
                        self._on_its_way(instance, entry)
                else:
                    self._settle(instance, entry.replica_id, entry.block_hashes, False)
            else:
                self._settle(instance, entry.replica_id, entry.block_hashes, True)
                if self._serves(entry.replica_id):
                    self._learn(entry.replica_id, entry.block_hashes, entry.session_key, now)
                    self.applied += 1

    def _on_its_way(self, instance: str, entry: Pending) -> None:
        """A sibling's request is on its way: its prefix is pending for this worker's
        policy, its prefill queued in this worker's view of the replica."""
        ticket = self.pool.remote_sent(entry.replica_id, entry.tokens)
        if ticket is None:
            return  # a replica this worker does not know
        self._remote_pending.setdefault(instance, {}).setdefault(
            (entry.replica_id, entry.block_hashes), deque()).append(ticket)
        self.policy.learn_remote_pending(entry.replica_id, entry.block_hashes, True)

    def _settle(self, instance: str, replica_id: str, block_hashes: tuple[int, ...],
                confirmed: bool) -> None:
        """One of ``instance``'s requests on its way is there (``confirmed``: its first
        byte came), or never will be."""
        on_its_way = self._remote_pending.get(instance)
        key = (replica_id, block_hashes)
        tickets = on_its_way.get(key) if on_its_way is not None else None
        if not tickets:
            return
        assert on_its_way is not None
        self.pool.remote_settled(replica_id, tickets.popleft(), confirmed)
        if not tickets:
            del on_its_way[key]
        self.policy.learn_remote_pending(replica_id, block_hashes, False)

    def _settle_all(self, instance: str) -> None:
        """``instance`` has nothing in flight, or is gone: none of its requests is on its
        way (a lost entry must not leave a prefix pending, or prefill queued, for good)."""
        for (replica_id, block_hashes), tickets in self._remote_pending.pop(instance,
                                                                            {}).items():
            for ticket in tickets:
                self.pool.remote_settled(replica_id, ticket, False)
                self.policy.learn_remote_pending(replica_id, block_hashes, False)

    def _learn(self, replica_id: str, block_hashes: tuple[int, ...],
               session_key: str | None, now: float) -> None:
        self.policy.learn_remote(replica_id, block_hashes, session_key, now)
        if self.journal is not None:
            self.journal.routed(replica_id, block_hashes, session_key, now)

    def _serves(self, replica_id: str) -> bool:
        """Replicas this instance does not know, or finds unhealthy, learn nothing."""
        try:
            return self.pool.get(replica_id).healthy
        except KeyError:
            return False

    def _expire_remote(self, now: float) -> None:
        cutoff = now - self.options.load_ttl_seconds
        expired = [i for i, (_, heard) in self._remote_load.items() if heard < cutoff]
        for instance in expired:
            del self._remote_load[instance]
            self._settle_all(instance)
        if expired:
            self.pool.set_remote_inflight(self.remote_inflight())
