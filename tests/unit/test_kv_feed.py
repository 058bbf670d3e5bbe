"""The gateway's KV-event feed: models registered, salted chains, resyncs (no sockets)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from engine.pool.replicas import HealthListener
from gateway.config import load_settings
from gateway.replicas.kv_feed import KVFeed
from policies.cache_aware import CacheAwarePolicy
from policies.events import BlockStored, EventBatch
from policies.hashing import block_hashes, chain_seed
from policies.precise import precise_policy


@dataclass
class FakeReplica:
    models: tuple[str, ...] = ("m",)


@dataclass
class FakePool:
    replica: FakeReplica = field(default_factory=FakeReplica)
    listeners: list[HealthListener] = field(default_factory=list)

    def get(self, replica_id: str) -> FakeReplica:
        assert replica_id == "r0"
        return self.replica

    def add_listener(self, listener: HealthListener) -> None:
        self.listeners.append(listener)


def salted_batch(seq: int) -> EventBatch:
    stored = BlockStored(
        block_hashes=(11, 12), parent_block_hash=None, token_ids=(1, 2, 3, 4), block_size=2,
        medium="GPU", cache_salt="tenant-a",
    )  # fmt: skip
    return EventBatch(seq=seq, timestamp=0.0, events=(stored,))


@pytest.fixture
def feed() -> tuple[KVFeed, FakePool, CacheAwarePolicy, list[str]]:
    settings = load_settings(
        overrides={
            "policy": "precise",
            "replicas": [{"id": "r0", "url": "http://127.0.0.1:1", "model": "m",
                          "kv_events": {"endpoint": "tcp://127.0.0.1:1"}}],
        },
        env={},
    )  # fmt: skip
    pool = FakePool()
    policy = precise_policy(clock=lambda: 0.0)
    kv_feed = KVFeed(settings, pool, policy)  # type: ignore[arg-type]
    resyncs: list[str] = []
    (subscriber,) = kv_feed.subscribers

    async def resync() -> None:
        resyncs.append(subscriber.config.replica_id)

    subscriber.start = lambda: None  # type: ignore[assignment,method-assign,return-value]
    subscriber.resync = resync  # type: ignore[method-assign]
    return kv_feed, pool, policy, resyncs


async def test_salted_blocks_land_in_the_salted_chain_of_the_replicas_model(feed) -> None:
    kv_feed, _, policy, _ = feed
    kv_feed.start()
    kv_feed._on_batch("r0", salted_batch(0))
    salted = block_hashes([1, 2, 3, 4], 2, chain_seed("m", "tenant-a"))
    assert policy.index.match(salted, now=0.0) == {"r0": 2}
    assert policy.index.match(block_hashes([1, 2, 3, 4], 2, chain_seed("m", None)), now=0.0) == {}
    await kv_feed.aclose()


async def test_batches_dropped_before_the_model_was_known_are_fetched_again(feed) -> None:
    kv_feed, pool, policy, resyncs = feed
    kv_feed.start()
    pool.replica.models = ()
    kv_feed._on_batch("r0", salted_batch(0))
    assert policy.index.size("r0") == 0 and kv_feed.batches == 0
    pool.replica.models = ("m",)
    kv_feed._on_batch("r0", salted_batch(1))
    await kv_feed.settle()
    assert resyncs == ["r0"] and kv_feed.batches == 1
    kv_feed._on_batch("r0", salted_batch(2))
    await kv_feed.settle()
    assert resyncs == ["r0"]
    await kv_feed.aclose()


async def test_a_replica_healthy_again_is_resynced(feed) -> None:
    kv_feed, pool, _, resyncs = feed
    kv_feed.start()
    (listener,) = pool.listeners
    listener("r0", False)
    await kv_feed.settle()
    assert resyncs == []
    listener("r0", True)
    await kv_feed.settle()
    assert resyncs == ["r0"]
    await kv_feed.aclose()
    listener("r0", True)  # after close: nothing is started any more
    await kv_feed.settle()
    assert resyncs == ["r0"]
