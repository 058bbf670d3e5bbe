"""prefix: the cache-aware policy on the approximate index, as the gateway drives it."""

from __future__ import annotations

import pytest

from policies.cache_aware import CacheAwarePolicy
from policies.prefix import prefix_policy
from policies.registry import default_registry
from policies.simulate import ManualClock
from policies.types import Decision, NoReplicaAvailable, ReplicaView, RouteRequest


def prompt(*hashes: int, session: str | None = None) -> RouteRequest:
    return RouteRequest(
        model="m", block_hashes=hashes, prompt_tokens=16 * len(hashes) + 5, session_key=session
    )


def route(policy: CacheAwarePolicy, request: RouteRequest, replicas: list[ReplicaView]) -> Decision:
    decision = policy.pick(request, replicas)
    policy.sent(request, decision.replica_id)
    policy.prefilled(request, decision.replica_id)
    return decision


IDLE = [ReplicaView(id="a"), ReplicaView(id="b"), ReplicaView(id="c")]
SYSTEM = tuple(range(1000, 1060))


def test_requests_sharing_a_prefix_follow_the_first():
    policy = prefix_policy(clock=ManualClock())
    first = route(policy, prompt(*SYSTEM, 1), IDLE)
    assert first.reason == "miss"
    for tail in range(2, 8):
        decision = route(policy, prompt(*SYSTEM, tail), IDLE)
        assert decision.replica_id == first.replica_id
        assert decision.reason == "hit"
        assert decision.matched_blocks[first.replica_id] == len(SYSTEM)
        assert set(decision.fallbacks) == {"a", "b", "c"} - {first.replica_id}


def test_index_entries_age_out():
    clock = ManualClock()
    policy = prefix_policy({"index_ttl_seconds": 5.0}, clock=clock)
    first = route(policy, prompt(*SYSTEM), IDLE)
    clock.now = 6.0
    assert policy.pick(prompt(*SYSTEM), IDLE).matched_blocks[first.replica_id] == 0


def test_capacity_comes_from_the_replica_views():
    policy = prefix_policy(clock=ManualClock())
    small = [ReplicaView(id="a", block_capacity=10)]
    route(policy, prompt(*SYSTEM), small)
    assert policy.indexed_blocks("a") == 10  # the LRU holds what the replica can
    assert policy.pick(prompt(*SYSTEM), small).matched_blocks["a"] == 10


def test_same_clock_same_decisions():
    def run() -> list[tuple[str, str]]:
        clock = ManualClock()
        policy = prefix_policy(clock=clock)
        out = []
        for step in range(40):
            clock.now = step * 0.5
            views = [ReplicaView(id=r, inflight=(step * (i + 1)) % 5) for i, r in enumerate("abc")]
            decision = route(policy, prompt(*SYSTEM[: step % 7 * 8], step), views)
            out.append((decision.replica_id, decision.reason))
        return out

    assert run() == run()


def test_a_hot_replica_sheds_its_prefix_and_the_decision_says_why():
    policy = prefix_policy(clock=ManualClock())
    home = route(policy, prompt(*SYSTEM), IDLE).replica_id
    hot = [ReplicaView(id=r.id, inflight=40, waiting=20) if r.id == home else r for r in IDLE]
    decision = policy.pick(prompt(*SYSTEM), hot)
    assert decision.replica_id != home
    assert decision.reason == "load-fallback"
    assert decision.fallbacks[-1] == home


def test_session_affinity_follows_the_session():
    policy = prefix_policy({"session_affinity": True}, clock=ManualClock())
    first = route(policy, prompt(1, session="s"), IDLE)
    busier = [ReplicaView(id=r.id, inflight=1 if r.id == first.replica_id else 0) for r in IDLE]
    again = route(policy, prompt(2, session="s"), busier)
    assert (again.replica_id, again.reason) == (first.replica_id, "session")


def test_forget_replica_drops_what_was_learned():
    policy = prefix_policy({"session_affinity": True}, clock=ManualClock())
    home = route(policy, prompt(*SYSTEM, session="s"), IDLE).replica_id
    policy.forget_replica(home)
    assert policy.indexed_blocks(home) == 0
    # the session starts over: it no longer prefers the forgotten replica
    assert route(policy, prompt(99, session="s"), IDLE).reason != "session"


def test_no_healthy_replica_raises():
    policy = prefix_policy(clock=ManualClock())
    with pytest.raises(NoReplicaAvailable):
        policy.pick(prompt(1), [ReplicaView(id="a", healthy=False)])


def test_registry_builds_it_with_a_clock_and_strict_options():
    clock = ManualClock()
    policy = default_registry(clock=clock).create(
        "prefix", {"scorer": "threshold", "cache_threshold": 0.3}
    )
    assert isinstance(policy, CacheAwarePolicy) and policy.scorer.name == "threshold"
    # 0.3 of the prompt matched is over the threshold: a hit, even on a busier replica
    home = route(policy, prompt(*SYSTEM[:20], 1), IDLE).replica_id
    busier = [ReplicaView(id=r.id, inflight=3 if r.id == home else 0) for r in IDLE]
    shorter = prompt(*SYSTEM[:20], *range(2, 40))
    assert policy.pick(shorter, busier).replica_id == home
    with pytest.raises(ValueError, match="unknown option"):
        default_registry(clock=clock).create("prefix", {"cache_treshold": 0.3})
    with pytest.raises(ValueError, match="needs a clock"):
        default_registry().create("prefix")
