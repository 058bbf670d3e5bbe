"""The supervisor's hub and two workers' ``LocalSync`` over a real Unix socket.

In-flight requests are what the process-level tests (``test_workers.py``)
cannot see from outside: a worker counts its siblings' requests in the load
its policy weighs, and stops counting a sibling's the moment it is gone.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from engine.backends.base import Timeouts
from engine.backends.httpx_client import HttpxBackend
from engine.pool.replicas import ReplicaPool, ReplicaSpec
from gateway.fleet.local import Hub, LocalSync
from policies.prefix import prefix_policy
from policies.types import RouteRequest
from tests.support.waiting import eventually
from tests.unit.fake_replica import FakeReplica

PROMPT = tuple(range(500, 512))


async def new_pool() -> ReplicaPool:
    replicas = [(ReplicaSpec(name, f"http://{name}", model="m"),
                 HttpxBackend(name, f"http://{name}", Timeouts(),
                              transport=FakeReplica(name).transport()))
                for name in ("r0", "r1")]
    pool = ReplicaPool(replicas, health_interval=3600)
    await pool.start()
    return pool


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[Hub]:
    started = Hub(str(tmp_path / "hub.sock"))
    await started.start()
    yield started
    await started.aclose()


async def worker(hub: Hub, index: int) -> tuple[LocalSync, ReplicaPool]:
    pool = await new_pool()
    sync = LocalSync(hub.path, index, pool, prefix_policy({}, clock=time.monotonic),
                     lambda: b"", lambda: b"")
    await sync.start()
    assert sync.up
    return sync, pool


async def test_a_siblings_in_flight_requests_count_until_it_is_gone(hub: Hub) -> None:
    a, a_pool = await worker(hub, 0)
    b, b_pool = await worker(hub, 1)
    try:
        a_pool.get("r1").inflight = 3  # three requests of worker A on r1 (leases count so)
        await eventually(lambda: b_pool.get("r1").remote_inflight == 3, 5,
                         "worker B counts worker A's requests")
        assert b_pool.get("r0").remote_inflight == 0
        await a.aclose()
        await eventually(lambda: b_pool.get("r1").remote_inflight == 0, 5,
                         "worker A's requests stop counting when it is gone")
    finally:
        await b.aclose()
        await a_pool.aclose()
        await b_pool.aclose()


async def test_a_new_worker_starts_from_what_the_others_learned(hub: Hub) -> None:
    a, a_pool = await worker(hub, 0)
    try:
        a.routed(RouteRequest("m", PROMPT, len(PROMPT) * 16, 16), "r1")
        await eventually(lambda: hub.journal.size("r1") == len(PROMPT), 5,
                         "the hub journalled worker A's prefix")
        late, late_pool = await worker(hub, 1)  # a worker started after it (a restart)
        try:
            policy = late.policy
            assert policy.pick(RouteRequest("m", PROMPT, len(PROMPT) * 16, 16),
                               late_pool.snapshot("m")).replica_id == "r1"
        finally:
            await late.aclose()
            await late_pool.aclose()
    finally:
        await a.aclose()
        await a_pool.aclose()


async def test_a_siblings_burst_is_followed_while_its_prefix_is_on_its_way(hub: Hub) -> None:
    a, a_pool = await worker(hub, 0)
    b, b_pool = await worker(hub, 1)
    request = RouteRequest("m", PROMPT, len(PROMPT) * 16, 16)
    try:
        pending = b.policy.pending  # type: ignore[attr-defined]
        a_pool.get("r1").inflight = 1  # its lease, held from before it is sent (the proxy)
        a.sent(request, "r1", 192)  # worker A sent the first request of a new prefix to r1
        await eventually(lambda: pending.match(PROMPT) == {"r1": len(PROMPT)}, 5,
                         "worker B sees the prefix on its way to r1")
        views = {view.id: view for view in b_pool.snapshot("m")}
        assert (views["r1"].pending_requests, views["r0"].pending_requests) == (1, 0)
        assert views["r1"].pending_prefill_tokens > 0  # its prefill, queued in B's view
        assert b.policy.pick(request, b_pool.snapshot("m")).replica_id == "r1"
        a.abandoned(request, "r1")
        await eventually(lambda: pending.match(PROMPT) == {}, 5, "and no longer once dropped")
        assert b_pool.snapshot("m")[1].pending_requests == 0
        a_pool.get("r1").inflight, a_pool.get("r0").inflight = 0, 1
        a.sent(request, "r0", 192)
        await eventually(lambda: pending.match(PROMPT) == {"r0": len(PROMPT)}, 5, "sent again")
        await a.aclose()  # a worker that dies leaves nothing pending behind it
        await eventually(lambda: pending.match(PROMPT) == {}, 5, "gone with its worker")
    finally:
        await a.aclose()
        await b.aclose()
        await a_pool.aclose()
        await b_pool.aclose()


async def test_the_first_workers_choice_for_a_new_prefix_stands(tmp_path: Path) -> None:
    now = [100.0]
    hub = Hub(str(tmp_path / "claims.sock"), clock=lambda: now[0])
    await hub.start()
    a, a_pool = await worker(hub, 0)
    b, b_pool = await worker(hub, 1)
    try:
        assert await a.claim(PROMPT[0], "r1") == "r1"
        assert await b.claim(PROMPT[0], "r0") == "r1"  # B follows A's placement
        assert await b.claim(PROMPT[1], "r0") == "r0"  # another prefix: B's own choice
        now[0] += 2.5  # long after: the prefix is learned, or no longer worth following
        assert await b.claim(PROMPT[0], "r0") == "r0"
        assert (b.claims, b.claims_followed) == (3, 1)
    finally:
        await a.aclose()
        await b.aclose()
        await a_pool.aclose()
        await b_pool.aclose()
        await hub.aclose()
