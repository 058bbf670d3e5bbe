"""Shared routing state: several gateway instances learn from each other through Redis.

Each instance publishes what it learns and applies what the others publish;
no decision ever waits for Redis.

* **Publishing.** A lifecycle observer (``gateway.fleet.publisher``) tells
  :meth:`FleetSync.routed` of every request the policy learned from (its
  replica, its KV-block hashes, its session key): a bounded in-memory queue,
  nothing else on the request's path (full: the entry is dropped and
  counted). A background task drains it every ``flush_seconds`` (or at
  ``batch_entries``) into one stream entry (``XADD {prefix}stream MAXLEN ~
  stream_maxlen``, msgpack: see ``gateway.fleet.codec``).
  ``load_tick_seconds`` after a lease changed them it adds the instance's
  own in-flight requests per replica when they changed, and at least every
  ``heartbeat_seconds``.
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
from collections.abc import Callable
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
    Entry,
    Load,
    Snapshot,
    decode_batch,
    decode_snapshot,
    encode_batch,
    encode_snapshot,
)
from gateway.fleet.journal import Journal
from gateway.fleet.shared import REDIS_OPTIONS, FleetOptions, SharedRouting
from policies.base import Policy

log = logging.getLogger("prefixgate.fleet")

REDIS_ERRORS = (RedisError, OSError, TimeoutError)


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


class FleetSync(SharedRouting):
    send_errors = REDIS_ERRORS

    def __init__(self, url: str, key_prefix: str, pool: ReplicaPool, policy: Policy, *,
                 options: FleetOptions = REDIS_OPTIONS,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        journal = Journal(blocks_per_replica=options.snapshot_blocks_per_replica)
        super().__init__(f"{socket.gethostname()}-{secrets.token_hex(4)}", pool, policy,
                         options=options, clock=clock, journal=journal)
        self.url = redact_url(url)
        self.wall_clock = wall_clock
        self.stream_key = key_prefix + "stream"
        self.snapshot_key = key_prefix + "snapshot"
        self.writer_key = key_prefix + "snapshot-writer"
        self.redis = Redis.from_url(url, socket_timeout=options.socket_timeout_seconds,
                                    socket_connect_timeout=options.socket_timeout_seconds,
                                    retry=Retry(NoBackoff(), 1))
        self.journal: Journal = journal
        self.synced = False
        self.last_id: str | None = None
        self.resyncs = 0
        self._snapshot_at = 0.0
        self._tasks: list[asyncio.Task[None]] = []
        self._lost = False
        pool.add_listener(self._on_health)
        self.watch_inflight()

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
        self._stop_load_tick()
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
        self._forget_remote_load()
        if not self._lost:
            self._lost = True
            log.warning("redis %s unreachable (%s: %s): serving on local routing state, "
                        "reconnecting with backoff", self.url, type(error).__name__, error)

    def _on_health(self, replica_id: str, healthy: bool) -> None:
        if not healthy:
            self.journal.forget_replica(replica_id)

    # -- publishing --------------------------------------------------------------

    async def _send(self, batch: list[Entry]) -> None:
        await self._xadd(batch)

    async def _after_publish(self, now: float) -> None:
        if self.synced and now - self._snapshot_at >= self.options.snapshot_seconds:
            await self._write_snapshot(now)

    async def _xadd(self, batch: list[Entry]) -> None:
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
        self._learn_snapshot(snapshot, max(0.0, self.wall_clock() - snapshot.written_at))
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


def fleet_of(settings: Settings, pool: ReplicaPool, policy: Policy) -> FleetSync | None:
    """The shared routing state the settings ask for (``redis_url``), or None."""
    if settings.redis_url is None:
        return None
    return FleetSync(settings.redis_url, settings.redis_key_prefix, pool, policy)
