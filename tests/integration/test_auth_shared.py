"""Per-key limits shared by two gateway instances through the real Redis on
127.0.0.1:6379 (``gateway.auth.shared``): two key stores synced step by step,
then two gateway processes and the openai client. Each test has its own key
prefix."""

from __future__ import annotations

import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import openai
import pytest
import redis as redis_sync
from redis.asyncio import Redis

from gateway.auth.keys import Grant, KeyStore
from gateway.auth.shared import INFLIGHT_TTL_SECONDS, SharedLimits
from gateway.errors import RateLimited
from tests.support.api_keys import write_keys
from tests.support.gateway import GatewayProcess
from tests.support.waiting import wait_until

from .conftest import MODEL, SYSTEM_REDIS, gateway_settings, running_sims, sim_args

KEY = "sk-shared-0001"


@pytest.fixture
async def redis() -> AsyncIterator[Redis]:
    client = Redis.from_url(SYSTEM_REDIS)
    try:
        await client.ping()
    except OSError:
        pytest.skip("no Redis on 127.0.0.1:6379")
    yield client
    await client.aclose()


class Fleet:
    """Two instances' key stores sharing limits, on one clock."""

    def __init__(self, tmp_path: Path, redis: Redis, prefix: str, **limits: int) -> None:
        self.now = 1_000_000.0
        path = write_keys(tmp_path / "keys.yaml", [{"key": KEY, "tenant": "t", **limits}])
        self.stores = [KeyStore(path, "s", clock=self.clock) for _ in range(2)]
        self.shared = [SharedLimits(store, redis, prefix, wall=self.clock, instance=f"i{i}")
                       for i, store in enumerate(self.stores)]

    def clock(self) -> float:
        return self.now

    def admit(self, instance: int) -> Grant:
        store = self.stores[instance]
        return store.admit(store.authenticate(KEY))

    async def sync(self) -> None:
        for shared in self.shared:
            await shared.sync()


async def test_requests_taken_on_one_instance_count_on_the_other(tmp_path: Path, redis: Redis,
                                                                 key_prefix: str) -> None:
    fleet = Fleet(tmp_path, redis, key_prefix, requests_per_minute=2)
    fleet.admit(1).release()  # instance 1 has served the key before
    fleet.admit(0).release()
    await fleet.sync()
    with pytest.raises(RateLimited, match="2 requests per minute"):
        fleet.admit(1)


async def test_tokens_given_back_after_usage_are_given_back_everywhere(tmp_path: Path, redis: Redis,
                                                                       key_prefix: str) -> None:
    fleet = Fleet(tmp_path, redis, key_prefix, tokens_per_minute=1000)
    fleet.admit(1).release()
    grant = fleet.admit(0)
    grant.charge(900, lambda: 100)
    await fleet.sync()
    other = fleet.admit(1)
    with pytest.raises(RateLimited, match="1000 tokens per minute"):
        other.charge(200, lambda: None)
    grant.release()  # 800 of the 900 come back, on instance 0 and then on 1
    await fleet.sync()
    other.charge(800, lambda: None)


async def test_concurrency_counts_requests_in_flight_on_every_instance(tmp_path: Path, redis: Redis,
                                                                       key_prefix: str) -> None:
    fleet = Fleet(tmp_path, redis, key_prefix, max_concurrency=1)
    fleet.admit(1).release()
    grant = fleet.admit(0)
    await fleet.sync()
    with pytest.raises(RateLimited, match="1 concurrent"):
        fleet.admit(1)
    grant.release()
    await fleet.sync()
    fleet.admit(1).release()
    # An instance that stops syncing (it died) stops counting.
    stuck = fleet.admit(0)
    await fleet.sync()
    fleet.now += INFLIGHT_TTL_SECONDS + 1
    await fleet.shared[1].sync()
    fleet.admit(1).release()
    assert stuck.usage.in_flight == 1


def test_two_gateways_share_a_keys_requests_per_minute(tmp_path: Path, key_prefix: str) -> None:
    keys = write_keys(tmp_path / "keys.yaml",
                      [{"key": KEY, "tenant": "t", "requests_per_minute": 3}])
    store = redis_sync.Redis.from_url(SYSTEM_REDIS)
    key_id = hashlib.sha256(KEY.encode()).digest()[:16].hex()

    def synced_after(moment: float) -> bool:
        """Both instances wrote their in-flight counts after ``moment`` (so read the totals)."""
        fields = store.hgetall(f"{key_prefix}auth:inflight:{key_id}")
        # bytes: the client does not decode what it reads
        return len(fields) == 2 and all(
            isinstance(v, bytes) and float(v.decode().partition(":")[2]) > moment
            for v in fields.values())

    def fleet_requests() -> float:
        totals = [store.hget(name, "requests") for name in store.scan_iter(f"{key_prefix}auth:2*")]
        return sum(float(t) for t in totals if t is not None)

    with running_sims([sim_args(0)]) as sims:
        gateways = [GatewayProcess(gateway_settings(sims, policy="prefix", api_keys=keys,
                                                    redis_url=SYSTEM_REDIS,
                                                    redis_key_prefix=key_prefix))
                    for _ in range(2)]
        try:
            one, two = (gw.start() for gw in gateways)
            clients = [openai.OpenAI(base_url=gw.url + "/v1", api_key=KEY, max_retries=0)
                       for gw in (one, two)]

            def ask(index: int) -> None:
                clients[index].chat.completions.create(
                    model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "hi"}])

            ask(1)  # two has served the key: 2 of its 3 left
            ask(0)
            ask(0)  # the key's 3 requests are spent, 2 of them on one
            wait_until(lambda: fleet_requests() == 3, 10, "the fleet's total in Redis")
            moment = time.time()
            wait_until(lambda: synced_after(moment), 10, "instance two synced")
            with pytest.raises(openai.RateLimitError) as limited:
                ask(1)
            assert int(limited.value.response.headers["retry-after"]) >= 1
        finally:
            for gw in gateways:
                gw.stop()
            store.close()
