"""What an instance does with what the others publish (no Redis here: the stream
replies are built with the real codec; the Redis round trips are integration tests)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from engine.backends.base import Timeouts
from engine.backends.httpx_client import HttpxBackend
from engine.pool.replicas import ReplicaPool, ReplicaSpec
from gateway.fleet.codec import Load, Routed, encode_batch, encode_snapshot
from gateway.fleet.journal import Journal
from gateway.fleet.sync import FleetOptions, FleetSync
from policies.cache_aware import CacheAwarePolicy
from policies.prefix import prefix_policy
from policies.prefix_index import ApproximatePrefixIndex
from policies.types import RouteRequest

from .fake_replica import FakeReplica

PROMPT = tuple(range(100, 110))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def pool() -> AsyncIterator[ReplicaPool]:
    replicas = [(ReplicaSpec(name, f"http://{name}", model="m"),
                 HttpxBackend(name, f"http://{name}", Timeouts(),
                              transport=FakeReplica(name).transport()))
                for name in ("r0", "r1", "r2")]
    pool = ReplicaPool(replicas, health_interval=3600)
    await pool.start()
    yield pool
    await pool.aclose()


def fleet_of(pool: ReplicaPool, clock: Clock, **options: object) -> tuple[FleetSync,
                                                                           CacheAwarePolicy]:
    policy = prefix_policy({"session_affinity": True}, clock=clock)
    fleet = FleetSync("redis://:pw@127.0.0.1:1/0", "t:", pool, policy,
                      options=FleetOptions(**options),  # type: ignore[arg-type]
                      clock=clock, wall_clock=lambda: 5000.0)
    return fleet, policy


def reply(*batches: tuple[str, list[Routed | Load]]) -> list:
    return [[b"t:stream", [(f"{i + 1}-0".encode(), {b"b": encode_batch(instance, entries)})
                           for i, (instance, entries) in enumerate(batches)]]]


def pick(policy: CacheAwarePolicy, pool: ReplicaPool, session: str | None = None) -> str:
    request = RouteRequest("m", PROMPT, len(PROMPT) * 16, 16, session)
    return policy.pick(request, pool.snapshot("m")).replica_id


async def test_another_instances_routing_is_learned(pool: ReplicaPool) -> None:
    clock = Clock()
    fleet, policy = fleet_of(pool, clock)
    assert policy.index.match(PROMPT, clock.now) == {}
    fleet._apply_reply(reply(("gw-b", [Routed("r2", PROMPT, "user-1")])), live=True)
    assert policy.index.match(PROMPT, clock.now) == {"r2": len(PROMPT)}
    assert policy.sessions.get("user-1", clock.now) == "r2"
    assert pick(policy, pool) == "r2"
    assert fleet.applied == 1 and fleet.last_id == "1-0"


async def test_own_unknown_and_unhealthy_replicas_entries_teach_nothing(
        pool: ReplicaPool) -> None:
    clock = Clock()
    fleet, policy = fleet_of(pool, clock)
    pool.report_failure("r1", "gone")
    fleet._apply_reply(reply((fleet.instance, [Routed("r0", PROMPT)]),
                             ("gw-b", [Routed("r9", PROMPT), Routed("r1", PROMPT)])), live=True)
    assert policy.index.match(PROMPT, clock.now) == {}
    assert fleet.applied == 0 and fleet.last_id == "2-0"


async def test_garbage_entries_are_counted_and_skipped(pool: ReplicaPool) -> None:
    fleet, _ = fleet_of(pool, Clock())
    fleet._apply_reply([[b"t:stream", [(b"7-0", {b"b": b"not msgpack"}), (b"8-0", {})]]],
                       live=True)
    assert fleet.bad_entries == 2 and fleet.last_id == "8-0"


async def test_remote_in_flight_adds_to_the_load_until_its_heartbeat_stops(
        pool: ReplicaPool) -> None:
    clock = Clock()
    fleet, _ = fleet_of(pool, clock, load_ttl_seconds=3.0)
    fleet._apply_reply(reply(("gw-b", [Load({"r0": 5})]), ("gw-c", [Load({"r0": 2, "r1": 1})])),
                       live=True)
    with pool.lease("r0"):
        loads = {view.id: view.inflight for view in pool.snapshot("m")}
    assert loads == {"r0": 8, "r1": 1, "r2": 0}
    assert fleet.peers() == 2
    clock.now += 2.0
    fleet._apply_reply(reply(("gw-c", [Load({"r1": 4})])), live=True)  # gw-c still beats
    clock.now += 1.5
    fleet._expire_remote(clock.now)
    assert {view.id: view.inflight for view in pool.snapshot("m")} == {"r0": 0, "r1": 4, "r2": 0}
    assert fleet.peers() == 1


async def test_a_backlogs_gauges_are_not_taken_for_live_ones(pool: ReplicaPool) -> None:
    fleet, _ = fleet_of(pool, Clock())
    fleet._apply_reply(reply(("gw-b", [Load({"r0": 5})])), live=False)
    assert fleet.remote_inflight() == {} and pool.get("r0").remote_inflight == 0


async def test_a_newcomer_starts_from_the_snapshot(pool: ReplicaPool) -> None:
    clock = Clock()
    journal = Journal()
    journal.routed("r1", PROMPT, "user-2", 10.0)
    journal.routed("r0", PROMPT[:4], None, 40.0)
    snapshot = journal.snapshot("42-1", 50.0, 4990.0)  # written 10 s before our wall clock
    fleet, policy = fleet_of(pool, clock)
    fleet._apply_snapshot(snapshot)
    assert fleet.last_id == "42-1"
    assert policy.index.match(PROMPT, clock.now) == {"r1": len(PROMPT), "r0": 4}
    assert policy.sessions.get("user-2", clock.now) == "r1"
    assert pick(policy, pool) == "r1"
    # The ages survive: 40 s (snapshot) + 10 s (since it was written) old.
    index = policy.index
    assert isinstance(index, ApproximatePrefixIndex)
    assert index.contains("r1", PROMPT[0], clock.now)
    assert not index.contains("r1", PROMPT[0], clock.now + 300.0 - 49.0)
    assert fleet.journal.snapshot("0-0", clock.now, 0.0).replicas.keys() == {"r0", "r1"}
    assert encode_snapshot(snapshot)  # what an instance writes is what a newcomer reads


async def test_publishing_never_blocks_and_drops_beyond_the_queue(pool: ReplicaPool) -> None:
    fleet, _ = fleet_of(pool, Clock(), queue_entries=2)
    for _ in range(5):
        fleet.routed(RouteRequest("m", PROMPT), "r0")
    fleet.routed(RouteRequest("m"), "r0")  # no blocks, no session: nothing to share
    assert len(fleet._pending) == 2 and fleet.dropped == 3
    assert fleet.status() == {"url": "redis://:***@127.0.0.1:1/0", "up": False, "synced": False,
                              "instance": fleet.instance, "peers": 0}
