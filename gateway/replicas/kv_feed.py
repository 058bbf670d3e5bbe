"""Feed every replica's vLLM KV-cache events to a policy that learns from them.

For each replica configured with ``kv_events`` a :class:`KVEventSubscriber`
follows its ZMQ stream: on start-up and on every reconnect it first fetches
the engine's replay buffer (so a replica that already caches prefixes is
known before it publishes anything new), then follows the live stream (gaps
recovered from the replay socket, engine restarts and lost batches turned
into a synthetic clear). Each decoded batch goes to the policy's
``apply_events``; the replica's model is registered first (``set_model``),
so the stored blocks' token ids re-hash into the same chains the gateway
computes for requests, salted ones included (``chain_seed(model, salt)``).

Two ways the policy can fall behind the engine's cache, both healed by
asking the subscriber to ``resync`` (clear, then the whole replay buffer
again): the router drops a replica's blocks when it turns unhealthy, so when
it is healthy again its still-cached blocks are fetched back; and batches
that arrive before the replica's model is known are dropped, so once the
model is known the buffer is fetched again.

Only a policy with an event consumer (``Policy.event_consumer()``) gets events;
with any other policy no subscriber is started.
"""

from __future__ import annotations

import asyncio
import logging

from engine.kv_events import KVEventSubscriber, SubscriberConfig
from engine.pool.replicas import ReplicaPool
from engine.tasks import cancel
from gateway.config import KVEventSettings, Settings
from policies.base import Policy
from policies.events import EventBatch

log = logging.getLogger("prefixgate.kv_feed")


class KVFeed:
    def __init__(self, settings: Settings, pool: ReplicaPool, policy: Policy) -> None:
        self.pool = pool
        self._consumer = policy.event_consumer()
        self._seeded: set[str] = set()
        self._dropped: set[str] = set()
        self._resyncs: set[asyncio.Task[None]] = set()
        self._running = False
        self.batches = 0
        self.subscribers: list[KVEventSubscriber] = []
        self._by_id: dict[str, KVEventSubscriber] = {}
        if self._consumer is None:
            return
        for replica_id, cfg in zip(settings.replica_ids(), settings.replicas):
            if cfg.kv_events is None:
                log.warning("replica %s has no kv_events endpoint: policy %s cannot see "
                            "its cache", replica_id, policy.name)
                continue
            self.follow(replica_id, cfg.kv_events)

    def follow(self, replica_id: str, kv_events: KVEventSettings) -> None:
        """Follow a replica's events: a configured one, or one that joined later (replica
        discovery), whose subscriber starts at once when the feed is running."""
        if self._consumer is None or replica_id in self._by_id:
            return
        subscriber = KVEventSubscriber(
            SubscriberConfig(replica_id=replica_id, endpoint=kv_events.endpoint,
                             replay_endpoint=kv_events.replay_endpoint, topic=kv_events.topic),
            on_batch=self._on_batch)
        self.subscribers.append(subscriber)
        self._by_id[replica_id] = subscriber
        if self._running:
            subscriber.start()

    async def unfollow(self, replica_id: str) -> None:
        """Stop following a replica that left (replica discovery)."""
        subscriber = self._by_id.pop(replica_id, None)
        if subscriber is None:
            return
        self.subscribers.remove(subscriber)
        self._seeded.discard(replica_id)
        self._dropped.discard(replica_id)
        await subscriber.aclose()

    def start(self) -> None:
        if self._consumer is not None and not self._running:
            self.pool.add_listener(self._on_health)
        self._running = True
        for subscriber in self.subscribers:
            subscriber.start()

    async def aclose(self) -> None:
        self._running = False
        await cancel(*self._resyncs)
        for subscriber in self.subscribers:
            await subscriber.aclose()

    async def settle(self) -> None:
        """Wait until the resyncs asked for so far are done."""
        await asyncio.gather(*self._resyncs, return_exceptions=True)

    def _resync(self, replica_id: str) -> None:
        subscriber = self._by_id.get(replica_id)
        if subscriber is None or not self._running:
            return
        task = asyncio.get_running_loop().create_task(subscriber.resync(),
                                                      name=f"kv-resync-{replica_id}")
        self._resyncs.add(task)
        task.add_done_callback(self._resyncs.discard)

    def _on_health(self, replica_id: str, healthy: bool) -> None:
        if healthy:
            log.info("replica %s is healthy again: refetching its KV events", replica_id)
            self._resync(replica_id)

    def _on_batch(self, replica_id: str, batch: EventBatch) -> None:
        assert self._consumer is not None
        if replica_id not in self._seeded:
            models = self.pool.get(replica_id).models
            if not models:
                log.debug("events from %s before its model is known: dropped", replica_id)
                self._dropped.add(replica_id)
                return
            self._consumer.set_model(replica_id, models[0])
            self._seeded.add(replica_id)
            if replica_id in self._dropped:
                self._dropped.discard(replica_id)
                self._resync(replica_id)  # what was dropped is still in the replay buffer
        self.batches += 1
        self._consumer.apply_events(replica_id, batch)
