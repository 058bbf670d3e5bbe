"""Per-key limits shared by the gateway instances of a fleet, through Redis.

With ``redis_url`` set, each instance keeps admitting on its own buckets
(``gateway.auth.keys``: no request waits for Redis) and, every
``SYNC_SECONDS``, tells the others what it took and takes off its buckets
what they took:

* Requests and tokens: per key and per minute of wall-clock time, one hash
  ``{prefix}auth:{minute}:{key id}`` with the fleet's totals (``requests``,
  ``tokens``), which every instance raises by what it took since its last
  sync (``HINCRBYFLOAT``; tokens given back after ``usage`` lower it). The
  answer is the fleet's total; less this instance's own share it is what the
  others took, and what they took since the last sync comes off this
  instance's buckets (what they gave back is returned). A new minute starts
  new totals; the hashes expire after three minutes.
* Concurrency: ``{prefix}auth:inflight:{key id}``, one field per instance
  holding its in-flight count and when it was written; counts older than
  ``INFLIGHT_TTL_SECONDS`` are ignored (an instance that died stops counting).
  A key's limit applies to its requests in flight on all instances.

The key id is the first 128 bits of the key's sha256, never the key. The
sharing is approximate by up to one sync period (a burst on several
instances at once can pass the limit by what each admitted meanwhile), and
a key an instance has not served yet starts with a full bucket there.
Redis down: the limits are each instance's own again; one warning when it
goes, one line when it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import socket
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.auth.keys import KeyStore, KeyUsage

log = logging.getLogger("prefixgate.auth")

SYNC_SECONDS = 0.5
INFLIGHT_TTL_SECONDS = 5.0
WINDOW_TTL_SECONDS = 180


@dataclass(slots=True)
class _Shares:
    """One key's figures in the current minute: this instance's own and the others'."""

    minute: int
    mine_requests: float = 0.0
    mine_tokens: float = 0.0
    others_requests: float = 0.0
    others_tokens: float = 0.0


class SharedLimits:
    def __init__(self, store: KeyStore, redis: Redis, key_prefix: str,
                 wall: Callable[[], float] = time.time, instance: str | None = None) -> None:
        self.store = store
        self.redis = redis
        self.prefix = key_prefix
        self.wall = wall
        self.instance = instance or f"{socket.gethostname()}-{secrets.token_hex(4)}"
        self._shares: dict[bytes, _Shares] = {}

    async def sync(self) -> None:
        """Publish what this instance took, apply what the others took (one round trip)."""
        now = self.wall()
        minute = int(now // 60)
        usages = self.store.usages()
        taken = [(usage.unshared_requests, usage.unshared_tokens) for _, usage in usages]
        pipe = self.redis.pipeline(transaction=False)
        for (principal, usage), (requests, tokens) in zip(usages, taken):
            usage.unshared_requests = usage.unshared_tokens = 0.0
            key_id = principal.digest[:16].hex()
            totals = f"{self.prefix}auth:{minute}:{key_id}"
            pipe.hincrbyfloat(totals, "requests", requests)
            pipe.hincrbyfloat(totals, "tokens", tokens)
            pipe.expire(totals, WINDOW_TTL_SECONDS)
            inflight = f"{self.prefix}auth:inflight:{key_id}"
            pipe.hset(inflight, self.instance, f"{usage.in_flight}:{now}")
            pipe.expire(inflight, int(INFLIGHT_TTL_SECONDS * 4))
            pipe.hgetall(inflight)
        try:
            results = await pipe.execute()
        except BaseException:
            for (_, usage), (requests, tokens) in zip(usages, taken):
                usage.unshared_requests += requests  # told next time
                usage.unshared_tokens += tokens
            raise
        clock = self.store.clock()
        for index, ((principal, usage), (requests, tokens)) in enumerate(zip(usages, taken)):
            fleet_requests, fleet_tokens, _, _, _, inflight = results[index * 6:index * 6 + 6]
            self._apply(principal.digest, usage, minute, clock, (requests, tokens),
                        (float(fleet_requests), float(fleet_tokens)))
            usage.remote_in_flight = self._others_in_flight(inflight, now)

    def _apply(self, digest: bytes, usage: KeyUsage, minute: int, clock: float,
               mine: tuple[float, float], fleet: tuple[float, float]) -> None:
        shares = self._shares.get(digest)
        if shares is None or shares.minute != minute:
            shares = self._shares[digest] = _Shares(minute)
        shares.mine_requests += mine[0]
        shares.mine_tokens += mine[1]
        others = (fleet[0] - shares.mine_requests, fleet[1] - shares.mine_tokens)
        usage.debit(others[0] - shares.others_requests, others[1] - shares.others_tokens, clock)
        shares.others_requests, shares.others_tokens = others

    def _others_in_flight(self, fields: dict[bytes, bytes], now: float) -> int:
        count = 0
        for instance, value in fields.items():
            text = value.decode()
            if instance.decode() == self.instance or ":" not in text:
                continue
            in_flight, _, written = text.partition(":")
            if now - float(written) <= INFLIGHT_TTL_SECONDS:
                count += int(in_flight)
        return count

    async def run(self, interval: float = SYNC_SECONDS) -> None:
        """``sync`` every ``interval`` seconds until cancelled, riding out Redis outages."""
        lost = False
        while True:
            await asyncio.sleep(interval)
            try:
                await self.sync()
            except (RedisError, OSError) as exc:
                if not lost:
                    log.warning("api key limits: Redis unreachable (%s: %s); each instance "
                                "limits on its own until it is back", type(exc).__name__, exc)
                lost = True
                continue
            if lost:
                log.info("api key limits: Redis is back; limits shared again")
            lost = False


@contextlib.asynccontextmanager
async def sharing(store: KeyStore | None, redis_url: str | None,
                  key_prefix: str) -> AsyncIterator[SharedLimits | None]:
    """Share ``store``'s limits through ``redis_url`` while the block runs (both set)."""
    if store is None or redis_url is None:
        yield None
        return
    redis = Redis.from_url(redis_url, socket_timeout=1.0, socket_connect_timeout=1.0)
    shared = SharedLimits(store, redis, key_prefix)
    task = asyncio.ensure_future(shared.run())
    try:
        yield shared
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await redis.aclose()
