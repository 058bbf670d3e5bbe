"""Two instances' in-flight requests through the real Redis, as their leases change them.

A lease is all a request a load-only policy routes has to tell the other
instances: its count reaches them as it starts and as it ends, not with the
next heartbeat (an hour away here), and nothing polls meanwhile.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from engine.pool.replicas import ReplicaPool
from gateway.fleet.sync import FleetOptions, FleetSync
from policies.least_load import LeastLoad
from tests.support.waiting import eventually
from tests.unit.fake_replica import fake_pool

from .conftest import SYSTEM_REDIS

QUIET = FleetOptions(heartbeat_seconds=3600.0, load_ttl_seconds=3600.0)


async def new_pool() -> ReplicaPool:
    return await fake_pool("r0", "r1")


@pytest.fixture
async def key_prefix() -> AsyncIterator[str]:
    prefix = f"pg-test-load-{secrets.token_hex(4)}:"
    yield prefix
    store = aioredis.Redis.from_url(SYSTEM_REDIS)
    keys = [key async for key in store.scan_iter(prefix + "*")]
    if keys:
        await store.delete(*keys)
    await store.aclose()


async def test_an_instances_leases_are_counted_by_another_as_they_start_and_end(
        key_prefix: str) -> None:
    pools = [await new_pool(), await new_pool()]
    a, b = (FleetSync(SYSTEM_REDIS, key_prefix, pool, LeastLoad(), options=QUIET,
                      clock=time.monotonic) for pool in pools)
    try:
        await a.start()
        await b.start()
        assert a.up and b.up
        with pools[0].lease("r1"), pools[0].lease("r1"):
            await eventually(lambda: pools[1].get("r1").remote_inflight == 2, 5,
                             "instance B counts instance A's two requests")
            # the load B's policy weighs
            assert {view.id: view.inflight for view in pools[1].snapshot("m")} == \
                {"r0": 0, "r1": 2}
        await eventually(lambda: pools[1].get("r1").remote_inflight == 0, 5,
                         "and stops counting them as they end")
    finally:
        await a.aclose()
        await b.aclose()
        for pool in pools:
            await pool.aclose()
