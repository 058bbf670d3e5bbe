"""The supervisor's hub and two workers' ``LocalSync`` over a real Unix socket.

In-flight requests are what the process-level tests (``test_workers.py``)
cannot see from outside: a worker counts its siblings' requests in the load
its policy weighs, and stops counting a sibling's the moment it is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from asgi_lifespan import LifespanManager

from engine.pool.replicas import ReplicaPool
from gateway.config import load_settings
from gateway.fleet.codec import Routed, encode_batch, pack_hashes
from gateway.fleet.local import LOCAL_OPTIONS, Hub, LocalSync, WorkerRole, _Worker
from gateway.fleet.shared import FleetOptions
from gateway.server.app import create_app
from policies.prefix import prefix_policy
from policies.types import RouteRequest
from tests.support.waiting import eventually
from tests.unit.fake_replica import FakeReplica, fake_pool

PROMPT = tuple(range(500, 512))


async def new_pool() -> ReplicaPool:
    return await fake_pool("r0", "r1")


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[Hub]:
    started = Hub(str(tmp_path / "hub.sock"))
    await started.start()
    yield started
    await started.aclose()


async def worker(hub: Hub, index: int,
                 options: FleetOptions = LOCAL_OPTIONS) -> tuple[LocalSync, ReplicaPool]:
    pool = await new_pool()
    sync = LocalSync(hub.path, index, pool, prefix_policy({}, clock=time.monotonic),
                     lambda: b"", lambda: b"", options=options)
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


async def test_requests_that_start_and_end_are_counted_by_a_sibling_without_a_heartbeat(
        hub: Hub) -> None:
    """A lease is all a request without a prefix (a load-only policy, a route that is not
    prefix-routed) has to tell: its count goes to the siblings as it starts and as it
    ends, not only with the next heartbeat (an hour away here)."""
    quiet = dataclasses.replace(LOCAL_OPTIONS, heartbeat_seconds=3600.0)
    a, a_pool = await worker(hub, 0, quiet)
    b, b_pool = await worker(hub, 1, quiet)
    try:
        with a_pool.lease("r1"), a_pool.lease("r1"), a_pool.lease("r0"):
            await eventually(lambda: (b_pool.get("r0").remote_inflight,
                                      b_pool.get("r1").remote_inflight) == (1, 2), 5,
                             "worker B counts worker A's requests as they start")
        await eventually(lambda: b_pool.get("r1").remote_inflight == 0
                         and b_pool.get("r0").remote_inflight == 0, 5,
                         "and stops counting them as they end")
    finally:
        await a.aclose()
        await b.aclose()
        await a_pool.aclose()
        await b_pool.aclose()


@contextlib.asynccontextmanager
async def running(hub: Hub, index: int) -> AsyncIterator[tuple[LocalSync, ReplicaPool]]:
    """A worker's link and its pool, closed at the end."""
    sync, pool = await worker(hub, index)
    try:
        yield sync, pool
    finally:
        await sync.aclose()
        await pool.aclose()


async def test_a_new_worker_starts_from_what_the_others_learned(hub: Hub) -> None:
    async with running(hub, 0) as (a, _):
        a.routed(RouteRequest("m", PROMPT, len(PROMPT) * 16, 16), "r1")
        await eventually(lambda: hub.journal.size("r1") == len(PROMPT), 5,
                         "the hub journalled worker A's prefix")
        async with running(hub, 1) as (late, late_pool):  # started after it (a restart)
            assert late.policy.pick(RouteRequest("m", PROMPT, len(PROMPT) * 16, 16),
                                    late_pool.snapshot("m")).replica_id == "r1"


async def test_a_new_worker_starts_from_the_latest_batches_the_hub_kept(
        tmp_path: Path) -> None:
    """The hub keeps a window of batches, not every one: the oldest go unread."""
    prompts = [tuple(range(1000 * k, 1000 * k + 12)) for k in range(1, 7)]
    one = len(encode_batch("w", [Routed("r1", prompts[0], None)]))
    hub = Hub(str(tmp_path / "window.sock"), window_bytes=3 * one + one // 2)

    def kept(packed: bytes) -> bool:
        return any(packed in batch for _, batch in hub._window)

    await hub.start()
    try:
        async with running(hub, 0) as (a, _):
            for k, prompt in enumerate(prompts):  # a batch each (a turn of A's loop between)
                a.routed(RouteRequest("m", prompt, len(prompt) * 16, 16), f"r{k % 2}")
                await eventually(functools.partial(kept, pack_hashes(prompt)), 5,
                                 "the hub kept the batch")
            async with running(hub, 1) as (late, late_pool):  # started after all six
                picks = [late.policy.pick(RouteRequest("m", prompt, len(prompt) * 16, 16),
                                          late_pool.snapshot("m")).replica_id
                         for prompt in prompts]
                indexed = late.policy.index  # type: ignore[attr-defined]
                known = [bool(indexed.match(prompt, time.monotonic())) for prompt in prompts]
                assert known == [False, False, False, True, True, True], known
                assert picks[3:] == ["r1", "r0", "r1"]  # where A sent each of the latest
    finally:
        await hub.aclose()


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


@pytest.fixture
async def clocked(tmp_path: Path) -> AsyncIterator[tuple[list[float], LocalSync, LocalSync]]:
    """A hub on a clock the test moves, and two workers of it."""
    now = [100.0]
    hub = Hub(str(tmp_path / "claims.sock"), clock=lambda: now[0])
    await hub.start()
    a, a_pool = await worker(hub, 0)
    b, b_pool = await worker(hub, 1)
    try:
        yield now, a, b
    finally:
        await a.aclose()
        await b.aclose()
        await a_pool.aclose()
        await b_pool.aclose()
        await hub.aclose()


async def test_the_first_workers_choice_for_a_new_prefix_stands(
        clocked: tuple[list[float], LocalSync, LocalSync]) -> None:
    now, a, b = clocked
    assert await a.claim(PROMPT[0], "r1") == "r1"
    assert await b.claim(PROMPT[0], "r0") == "r1"  # B follows A's placement
    assert await b.claim(PROMPT[1], "r0") == "r0"  # another prefix: B's own choice
    now[0] += 2.5  # long after: the prefix is learned, or no longer worth following
    assert await b.claim(PROMPT[0], "r0") == "r0"
    assert (b.claims, b.claims_followed) == (3, 1)


async def test_a_new_prefix_a_worker_has_not_heard_of_yet_is_not_joined(
        clocked: tuple[list[float], LocalSync, LocalSync]) -> None:
    """Two workers placing two different new prefixes at the same moment each pick the
    replica idle in their own view: the hub sends the later one to the next replica of
    its worker's ranking, as one process that saw the first one's prefill would."""
    now, a, b = clocked
    assert await a.claim(PROMPT[0], "r0", ("r1",)) == "r0"
    assert await b.claim(PROMPT[1], "r0", ("r1",)) == "r1"  # A's is unseen yet
    assert await a.claim(PROMPT[2], "r0", ("r1",)) == "r0"  # its own it has seen
    now[0] += 0.2  # by now each has heard of the other's requests
    assert await b.claim(PROMPT[3], "r0", ("r1",)) == "r0"
    assert await b.claim(PROMPT[1], "r0", ("r1",)) == "r1"  # still B's first choice


async def test_a_worker_stops_claiming_for_a_while_when_the_hub_is_slow(hub: Hub) -> None:
    a, a_pool = await worker(hub, 0)
    try:
        hub._handle = lambda *_: None  # type: ignore[method-assign]  # a hub that never answers
        assert await a.claim(PROMPT[0], "r1", ("r0",)) == "r1"
        assert (a.claims, a.claims_unanswered) == (1, 1)
        assert await a.claim(PROMPT[1], "r0", ("r1",)) == "r0"
        assert a.claims == 1  # not asked: new prefixes are not held behind a slow hub
    finally:
        await a.aclose()
        await a_pool.aclose()


class _SlowHub(Hub):
    """Answers claims ``delay`` seconds late, as a hub busy with a burst does."""

    delay = 0.05

    def _handle(self, worker: _Worker, kind: bytes, payload: bytes) -> None:
        if kind == b"C":
            asyncio.get_running_loop().call_later(self.delay, super()._handle, worker, kind,
                                                  payload)
        else:
            super()._handle(worker, kind, payload)


class _SlowReplica(FakeReplica):
    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/v1/"):
            await asyncio.sleep(0.3)  # still in flight when the next request decides
        return await super().handle(request)


async def test_a_worker_places_its_new_prefixes_one_after_the_other(tmp_path: Path) -> None:
    """Two new prompts taken by one worker while the hub answers its first claim: the
    second is decided once the first is on its way, and goes past its queued prefill to
    the other replica, as with one process (deciding both while the claim is out put
    both on the replica that looked idlest)."""
    hub = _SlowHub(str(tmp_path / "slow.sock"))
    await hub.start()
    replicas = {name: _SlowReplica(name) for name in ("r0", "r1")}
    replicas["r1"].running = 1  # another client's request: both new prompts prefer r0
    settings = load_settings(overrides={
        "replicas": [{"id": name, "url": f"http://{name}"} for name in replicas],
        "health_interval": 3600.0, "policy": "prefix"}, env={})
    app = create_app(settings, transport=lambda rid: replicas[rid].transport(),
                     worker=WorkerRole(0, hub.path))
    try:
        async with LifespanManager(app) as manager, httpx.AsyncClient(
                transport=httpx.ASGITransport(app=manager.app), base_url="http://gw") as client:
            async def ask(system: str) -> str:
                response = await client.post("/v1/chat/completions", json={
                    "model": "m", "messages": [{"role": "system", "content": system * 200},
                                               {"role": "user", "content": "hello"}]})
                assert response.status_code == 200, response.text
                return response.headers["x-prefixgate-replica"]

            placed = await asyncio.gather(ask("You are a pirate. "), ask("You are a judge. "))
        assert sorted(placed) == ["r0", "r1"], placed
    finally:
        await hub.aclose()
