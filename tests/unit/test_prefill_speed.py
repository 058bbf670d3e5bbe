"""The speed a replica's unconfirmed prefill is assumed to drain at follows the cost
model's ``prefill_seconds_per_token``: in the live pool, in the gateway's wiring, and in
the capacity replay (the routing the replay simulates is the live gateway's)."""

from __future__ import annotations

from collections import Counter

import pytest

from engine.backends.base import Timeouts
from engine.backends.httpx_client import HttpxBackend
from engine.pool.replicas import PREFILL_SECONDS_PER_TOKEN, ReplicaPool, ReplicaSpec
from engine.sim.latency import LatencyModel, LatencyParams
from gateway.config import load_settings
from gateway.replay.fleet import FleetSpec, replay
from gateway.replay.workload import build_workload
from gateway.server.parts import build_pool
from gateway.trace.format import TraceLine
from policies.cost_scorer import CostConfig, drain_seconds_per_token
from policies.simulate import ManualClock
from tests.unit.fake_replica import FakeReplica

COST_DEFAULT = CostConfig.prefill_seconds_per_token
"""What the cost model prices prefill at when the options say nothing (10k tokens/s)."""


@pytest.mark.parametrize(("options", "expected"), [
    ({"prefill_seconds_per_token": 0.0005}, 0.0005),
    ({"prefill_seconds_per_token": "2e-5"}, 2e-5),       # as the replay's CLI gives it
    ({}, COST_DEFAULT),
    ({"prefill_seconds_per_token": 0}, COST_DEFAULT),   # prefill not priced
    ({"prefill_seconds_per_token": "fast"}, COST_DEFAULT),  # the policy says why
    ({"prefill_seconds_per_token": float("inf")}, COST_DEFAULT),
])
def test_the_drain_speed_is_the_cost_models_where_it_sets_one(options: dict, expected: float
                                                              ) -> None:
    assert drain_seconds_per_token(options) == expected


def pool_at(clock: ManualClock, speed: float = PREFILL_SECONDS_PER_TOKEN) -> ReplicaPool:
    replica = FakeReplica("r0")
    backend = HttpxBackend("r0", "http://r0", Timeouts(), transport=replica.transport())
    return ReplicaPool([(ReplicaSpec(id="r0", url="http://r0", model=replica.model), backend)],
                       clock=clock, prefill_seconds_per_token=speed)


def test_a_pool_drains_unconfirmed_prefill_at_its_speed() -> None:
    """1,000 tokens sent and not confirmed: after 0.25 s a 2k-tokens/s replica has 500
    left; at the default 10k tokens/s they were gone after 0.1 s."""
    clock = ManualClock(100.0)
    slow, default = pool_at(clock, 0.0005), pool_at(clock)
    with slow.lease("r0", 1000), default.lease("r0", 1000):
        clock.now += 0.25
        [slow_view], [default_view] = slow.snapshot(), default.snapshot()
        assert slow_view.pending_prefill_tokens == 500
        assert slow.pending_prefill("r0") == (1, 500)
        assert default_view.pending_prefill_tokens == 0
    with pytest.raises(ValueError, match="positive"):
        pool_at(clock, 0.0)


def test_the_gateway_gives_its_pool_the_cost_models_speed() -> None:
    replicas = [{"id": "r0", "url": "http://127.0.0.1:9", "model": "m"}]
    declared = load_settings(overrides={
        "replicas": replicas, "policy": "prefix",
        "policy_options": {"prefill_seconds_per_token": 0.0005}}, env={})
    plain = load_settings(overrides={"replicas": replicas, "policy": "prefix"}, env={})
    assert build_pool(declared, lambda _: None).prefill_seconds_per_token == 0.0005
    assert build_pool(plain, lambda _: None).prefill_seconds_per_token \
        == PREFILL_SECONDS_PER_TOKEN


def test_the_replay_drains_at_the_declared_speed_too() -> None:
    """The integration test's shape, replayed: replicas at 2k tokens/s, 12 non-streamed
    first turns behind one system prompt, each with 1,000 tokens of its own, 80 ms apart.
    Declared at that speed, each replica serves 3; drained at 10k tokens/s, 2 replicas
    served 6 each (the replay reports what the live gateway would do)."""
    system = tuple(range(60))                       # 60 blocks of 16: 960 tokens
    lines = [TraceLine(timestamp_ms=80 * user, input_length=16 * 123, output_length=16,
                       hash_ids=system + tuple(10_000 * (user + 1) + i for i in range(63)),
                       block_size=16, model="m", stream=False) for user in range(12)]
    workload = build_workload(lines)
    latency = LatencyModel(LatencyParams(step_overhead_s=0.005, prefill_per_token_s=0.0005,
                                         decode_per_seq_s=0.0002),
                           block_size=16, num_blocks=4096, max_num_batched_tokens=8192)
    outcome = replay(workload, FleetSpec(
        replicas=4, latency=latency, num_blocks=4096, block_size=16, policy="prefix",
        policy_options={"prefill_seconds_per_token": 0.0005}))
    served = Counter({load.id: load.requests for load in outcome.loads})
    assert sorted(served.values()) == [3, 3, 3, 3], served
