"""Shared routing state: several gateway instances learn from each other through Redis.

Each instance publishes what it learns and applies what the others publish;
no decision ever waits for Redis.

* **Publishing.** A lifecycle observer (``gateway.fleet.publisher``) tells
  :meth:`FleetSync.routed` of every request the policy learned from (its
  replica, its KV-block hashes, its session key): a bounded in-memory queue,
  nothing else on the request's path (full: the entry is dropped and
  counted). A background task drains it every ``flush_seconds`` (or at
  ``batch_entries``) into one stream entry (``XADD {prefix}stream MAXLEN ~
  stream_maxlen``, msgpack: see ``gateway.fleet.codec``). Every
  ``load_tick_seconds`` it adds the instance's own in-flight requests per
  replica when they changed, and at least every ``heartbeat_seconds``.
* **Applying.** Another task reads the stream (``XREAD BLOCK``) and, for
  entries of other instances, calls ``Policy.learn_remote`` (the prefix
  index records the blocks, the session table the session) for replicas
  this instance knows and finds healthy. In-flight gauges are summed over
  the instances heard from within ``load_ttl_seconds`` and added to the
  load the policy sees (``ReplicaPool.set_remote_inflight``): a dead
  instance's requests vanish from it when its heartbeat stops.
* **Snapshot.** Everything learned also goes to a bounded journal
  (``gateway.fleet.journal``); every ``snapshot_seconds`` one instance (the
  holder of a lease key, ``{prefix}snapshot-writer``) writes it to
  ``{prefix}snapshot`` with the stream id it covers (both keys expire
  ``snapshot_ttl_seconds`` after the last write: a deployment that is gone
  leaves nothing behind). A starting instance applies the snapshot and then the
  stream's tail after that id, for up to ``startup_sync_seconds`` before it
  serves (then on in the background).
* **Redis down or slow.** The instance serves on its local state; one log
  line when Redis is lost and one when it is back, ``prefixgate_redis_up``
  0 meanwhile (``gateway.fleet.metrics``). The reader reconnects with
  exponential backoff (``backoff_initial_seconds`` .. ``backoff_max_seconds``)
  and resynchronises: the stream's tail after the last entry it read when
  that is still in the stream, else the snapshot and its tail. Entries
  published while Redis is away are dropped (counted), and kept in the
  journal, so the next snapshot carries them.

Replicas are named by their id, so every instance must give the same
replicas the same ids (the same config does). The password and TLS come
from the URL (``redis://:PASSWORD@host:6379/0``, ``rediss://...``); logs show
it redacted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from engine.pool.replicas import ReplicaPool
from engine.tasks import cancel
from gateway.config import Settings
from gateway.fleet.codec import (
    BadPayload,
    Load,
    Routed,
    Snapshot,
    decode_batch,
    decode_snapshot,
    encode_batch,
    encode_snapshot,
)
from gateway.fleet.journal import Journal
from policies.base import Policy
from policies.types import RouteRequest

log = logging.getLogger("prefixgate.fleet")

REDIS_ERRORS = (RedisError, OSError, TimeoutError)


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


def redact_url(url: str) -> str:
    """The URL with its password (if any) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username or ''}:***@{host}"))


def stream_id_key(stream_id: str) -> tuple[int, int]:
    millis, _, seq = stream_id.partition("-")
    return int(millis), int(seq or 0)


class FleetSync:
    def __init__(self, url: str, key_prefix: str, pool: ReplicaPool, policy: Policy, *,
                 options: FleetOptions = FleetOptions(),
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self.url = redact_url(url)
        self.options = options
        self.pool = pool
        self.policy = policy
        self.clock = clock
        self.wall_clock = wall_clock
        self.instance = f"{socket.gethostname()}-{secrets.token_hex(4)}"
        self.stream_key = key_prefix + "stream"
        self.snapshot_key = key_prefix + "snapshot"
        self.writer_key = key_prefix + "snapshot-writer"
        self.redis = Redis.from_url(url, socket_timeout=options.socket_timeout_seconds,
                                    socket_connect_timeout=options.socket_timeout_seconds,
                                    retry=Retry(NoBackoff(), 1))
        self.journal = Journal(blocks_per_replica=options.snapshot_blocks_per_replica)
        self.up = False
        self.synced = False
        self.last_id: str | None = None
        self.published = self.dropped = self.applied = self.bad_entries = self.resyncs = 0
        self._pending: deque[Routed] = deque()
        self._wake = asyncio.Event()
        self._remote_load: dict[str, tuple[dict[str, int], float]] = {}
        self._sent_load: dict[str, int] | None = None
        self._sent_load_at = 0.0
        self._snapshot_at = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._lost = False
        pool.add_listener(self._on_health)

    # -- the request path: never awaits ------------------------------------------

    def routed(self, request: RouteRequest, replica_id: str) -> None:
        """Queue what the policy just learned for publishing (``FleetPublisher``)."""
        if not request.block_hashes and request.session_key is None:
            return  # a load-only policy's request: nothing to share
        if len(self._pending) >= self.options.queue_entries:
            self.dropped += 1
            return
        self._pending.append(Routed(replica_id, request.block_hashes, request.session_key))
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

    def status(self) -> dict[str, object]:
        """For ``/ready``: Redis is optional, so this never makes the gateway unready."""
        return {"url": self.url, "up": self.up, "synced": self.synced,
                "instance": self.instance, "peers": self.peers()}

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Rebuild from Redis for up to ``startup_sync_seconds``, then run in the background."""
        try:
            await asyncio.wait_for(self._sync(), self.options.startup_sync_seconds)
            self._set_up(True, None)
        except (*REDIS_ERRORS, BadPayload) as exc:
            self._set_up(False, exc)
        self._tasks = [asyncio.create_task(self._publish_loop(), name="fleet-publish"),
                       asyncio.create_task(self._read_loop(), name="fleet-read")]

    async def aclose(self) -> None:
        await cancel(*self._tasks)
        self._tasks.clear()
        if self.up:  # the others stop counting this instance's requests at once
            with contextlib.suppress(*REDIS_ERRORS):
                await asyncio.wait_for(self._xadd([Load({})]), 1.0)
        await self.redis.aclose()

    def _set_up(self, up: bool, error: BaseException | None) -> None:
        """One log line when Redis is lost, one when it is back; not one per failure."""
        was, self.up = self.up, up
        if up:
            if not was:
                log.info("redis %s: sharing routing state (instance %s, %s)", self.url,
                         self.instance, "resynchronised" if self._lost else "synchronised")
            self._lost = False
            return
        self.synced = False
        if self._remote_load:
            self._remote_load.clear()
            self.pool.set_remote_inflight({})
        if not self._lost:
            self._lost = True
            log.warning("redis %s unreachable (%s: %s): serving on local routing state, "
                        "reconnecting with backoff", self.url, type(error).__name__, error)

    def _on_health(self, replica_id: str, healthy: bool) -> None:
        if not healthy:
            self.journal.forget_replica(replica_id)

    # -- publishing --------------------------------------------------------------

    async def _publish_loop(self) -> None:
        options = self.options
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), options.load_tick_seconds)
            self._wake.clear()
            if self._pending and len(self._pending) < options.batch_entries:
                await asyncio.sleep(options.flush_seconds)
            now = self.clock()
            self._expire_remote(now)
            while self._pending or self._load_due(now):
                await self._publish(self._take(now), now)
            if self.synced and now - self._snapshot_at >= options.snapshot_seconds:
                await self._write_snapshot(now)

    def _take(self, now: float) -> list[Routed | Load]:
        batch: list[Routed | Load] = []
        while self._pending and len(batch) < self.options.batch_entries:
            entry = self._pending.popleft()
            self.journal.routed(entry.replica_id, entry.block_hashes, entry.session_key, now)
            batch.append(entry)
        if self._load_due(now):
            batch.append(Load(self._own_inflight()))
        return batch

    def _own_inflight(self) -> dict[str, int]:
        return {replica.id: replica.inflight for replica in self.pool if replica.inflight}

    def _load_due(self, now: float) -> bool:
        return self.up and (self._own_inflight() != self._sent_load
                            or now - self._sent_load_at >= self.options.heartbeat_seconds)

    async def _publish(self, batch: list[Routed | Load], now: float) -> None:
        if not self.up:  # the reader is reconnecting; the journal kept the entries
            self.dropped += sum(isinstance(entry, Routed) for entry in batch)
            return
        try:
            await self._xadd(batch)
        except REDIS_ERRORS as exc:
            self.dropped += sum(isinstance(entry, Routed) for entry in batch)
            self._set_up(False, exc)
            return
        self.published += sum(isinstance(entry, Routed) for entry in batch)
        for entry in batch:
            if isinstance(entry, Load):
                self._sent_load, self._sent_load_at = entry.inflight, now

    async def _xadd(self, batch: list[Routed | Load]) -> None:
        await self.redis.xadd(self.stream_key, {"b": encode_batch(self.instance, batch)},
                              maxlen=self.options.stream_maxlen, approximate=True)

    async def _write_snapshot(self, now: float) -> None:
        """The journal as the snapshot, when it changed, by one instance at a time (the
        holder of ``{prefix}snapshot-writer``, taken when free and kept while it writes);
        the keys expire ``snapshot_ttl_seconds`` after the last write."""
        self._snapshot_at = now
        ttl_ms = int(self.options.snapshot_ttl_seconds * 1000)
        try:
            if self.journal.changed and await self._holds_writer():
                # The copy is C-speed; making and encoding it runs in a worker thread
                # (about 13 ms for 4 x 16,384 blocks on an idle core).
                copy = self.journal.copy()
                covered, written = self.last_id or "0-0", self.wall_clock()
                data = await asyncio.to_thread(
                    lambda: encode_snapshot(copy.snapshot(covered, now, written)))
                await self.redis.set(self.snapshot_key, data, px=ttl_ms)
            await self.redis.pexpire(self.stream_key, ttl_ms)
        except REDIS_ERRORS as exc:
            self.journal.changed = True  # written after the reconnect
            self._set_up(False, exc)

    async def _holds_writer(self) -> bool:
        lease_ms = int(self.options.snapshot_seconds * 3000)
        if await self.redis.set(self.writer_key, self.instance, nx=True, px=lease_ms):
            return True
        if await self.redis.get(self.writer_key) == self.instance.encode():
            await self.redis.pexpire(self.writer_key, lease_ms)
            return True
        return False

    # -- applying ----------------------------------------------------------------

    async def _read_loop(self) -> None:
        delay = self.options.backoff_initial_seconds
        while True:
            if not self.up:
                try:
                    await self._sync()
                except (*REDIS_ERRORS, BadPayload) as exc:
                    self._set_up(False, exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.options.backoff_max_seconds)
                    continue
                delay = self.options.backoff_initial_seconds
                self._set_up(True, None)
            try:
                reply = await self.redis.xread({self.stream_key: self.last_id or "0-0"},
                                               count=self.options.read_count,
                                               block=self.options.read_block_ms)
            except REDIS_ERRORS as exc:
                self._set_up(False, exc)
                continue
            self._apply_reply(reply, live=True)

    async def _sync(self) -> None:
        """Catch up: the tail after the last entry read if it is still there, else the
        snapshot (when there is one) and the tail after it."""
        newest = await self.redis.xrevrange(self.stream_key, count=1)
        oldest = await self.redis.xrange(self.stream_key, count=1)
        if not self._tail_kept(oldest, newest):
            raw = await self.redis.get(self.snapshot_key)
            self.last_id = "0-0"
            if isinstance(raw, bytes):
                self._apply_snapshot(decode_snapshot(raw))
        while True:
            reply = await self.redis.xread({self.stream_key: self.last_id or "0-0"},
                                           count=self.options.read_count)
            if not self._apply_reply(reply, live=False):
                break
        self.synced = True
        self.resyncs += 1

    def _tail_kept(self, oldest: Any, newest: Any) -> bool:
        if self.last_id is None or not oldest or not newest:
            return False
        last = stream_id_key(self.last_id)
        return (stream_id_key(oldest[0][0].decode()) <= last
                <= stream_id_key(newest[0][0].decode()))

    def _apply_snapshot(self, snapshot: Snapshot) -> None:
        now = self.clock()
        behind = max(0.0, self.wall_clock() - snapshot.written_at)
        for replica_id, runs in snapshot.replicas.items():
            if self._serves(replica_id):
                for run in runs:
                    self._learn(replica_id, run.block_hashes, None, now - behind - run.age)
        for session_key, replica_id, age in snapshot.sessions:
            if self._serves(replica_id):
                self._learn(replica_id, (), session_key, now - behind - age)
        self.last_id = snapshot.stream_id

    def _apply_reply(self, reply: Any, live: bool) -> int:
        """Apply an ``XREAD`` reply (RESP2 list or RESP3 map); returns its entry count."""
        count = 0
        for _stream, entries in (reply.items() if isinstance(reply, dict) else reply or ()):
            for entry_id, fields in entries:
                count += 1
                self.last_id = entry_id.decode()
                try:
                    batch = decode_batch(fields.get(b"b", b""))
                except BadPayload:
                    self.bad_entries += 1
                    continue
                if batch.instance != self.instance:
                    self._apply_batch(batch.instance, batch.entries, live)
        return count

    def _apply_batch(self, instance: str, entries: tuple[Routed | Load, ...],
                     live: bool) -> None:
        now = self.clock()
        for entry in entries:
            if isinstance(entry, Load):
                if live:  # a gauge read from the backlog is stale
                    self._remote_load[instance] = (entry.inflight, now)
                    self.pool.set_remote_inflight(self.remote_inflight())
            elif self._serves(entry.replica_id):
                self._learn(entry.replica_id, entry.block_hashes, entry.session_key, now)
                self.applied += 1

    def _learn(self, replica_id: str, block_hashes: tuple[int, ...],
               session_key: str | None, now: float) -> None:
        self.policy.learn_remote(replica_id, block_hashes, session_key, now)
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
        if expired:
            self.pool.set_remote_inflight(self.remote_inflight())


def fleet_of(settings: Settings, pool: ReplicaPool, policy: Policy) -> FleetSync | None:
    """The shared routing state the settings ask for (``redis_url``), or None."""
    if settings.redis_url is None:
        return None
    return FleetSync(settings.redis_url, settings.redis_key_prefix, pool, policy)
