"""Feed every replica's vLLM KV-cache events to a policy that learns from them.

For each replica configured with ``kv_events`` a :class:`KVEventSubscriber`
follows its ZMQ stream (gaps recovered from the replay socket, engine
restarts and lost batches turned into a synthetic clear). Each decoded batch
goes to the policy's ``apply_events``; the chain seed of the replica's model
is registered first, so the stored blocks' token ids re-hash into the same
chain the gateway computes for requests. Only policies implementing
``policies.precise.KVEventConsumer`` get events; with any other policy no
subscriber is started.
"""

from __future__ import annotations

import logging

from engine.kv_events import KVEventSubscriber, SubscriberConfig
from engine.pool import ReplicaPool
from policies.base import Policy
from policies.events import EventBatch
from policies.hashing import chain_seed
from policies.precise import KVEventConsumer

from .config import Settings

log = logging.getLogger("prefixgate.kv_feed")


class KVFeed:
    def __init__(self, settings: Settings, pool: ReplicaPool, policy: Policy) -> None:
        self.pool = pool
        self._consumer = policy if isinstance(policy, KVEventConsumer) else None
        self._seeded: set[str] = set()
        self.batches = 0
        self.subscribers: list[KVEventSubscriber] = []
        if self._consumer is None:
            return
        for replica_id, cfg in zip(settings.replica_ids(), settings.replicas):
            if cfg.kv_events is None:
                log.warning("replica %s has no kv_events endpoint: policy %s cannot see "
                            "its cache", replica_id, policy.name)
                continue
            self.subscribers.append(KVEventSubscriber(
                SubscriberConfig(replica_id=replica_id, endpoint=cfg.kv_events.endpoint,
                                 replay_endpoint=cfg.kv_events.replay_endpoint,
                                 topic=cfg.kv_events.topic),
                on_batch=self._on_batch))

    def start(self) -> None:
        for subscriber in self.subscribers:
            subscriber.start()

    async def aclose(self) -> None:
        for subscriber in self.subscribers:
            await subscriber.aclose()

    def _on_batch(self, replica_id: str, batch: EventBatch) -> None:
        assert self._consumer is not None
        if replica_id not in self._seeded:
            models = self.pool.get(replica_id).models
            if not models:
                log.debug("events from %s before its model is known: dropped", replica_id)
                return
            self._consumer.set_seed(replica_id, chain_seed(models[0], None))
            self._seeded.add(replica_id)
        self.batches += 1
        self._consumer.apply_events(replica_id, batch)
