"""chwbl: prefix keys on a ring, never above the load bound."""

from __future__ import annotations

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.bounded_load import load_bound
from policies.chwbl import Chwbl, ChwblConfig
from policies.registry import default_registry
from policies.types import NoReplicaAvailable, ReplicaView, RouteRequest


def views(*loads: int) -> list[ReplicaView]:
    return [ReplicaView(id=f"r{i}", inflight=load) for i, load in enumerate(loads)]


def uniform(key: int) -> int:
    """Chain hashes are uniform 64-bit values; small test ints are not."""
    return xxhash.xxh3_64_intdigest(key.to_bytes(8, "little"))


def request(*hashes: int, session: str | None = None) -> RouteRequest:
    return RouteRequest(
        model="m", block_hashes=hashes, prompt_tokens=16 * len(hashes), session_key=session
    )


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=500), min_size=1, max_size=12),
    st.lists(st.integers(min_value=0, max_value=2**64 - 1), max_size=6),
    st.sampled_from([1.0, 1.1, 1.25, 2.0]),
)
def test_never_exceeds_the_bound_for_any_load_vector(loads, hashes, load_factor):
    policy = Chwbl(ChwblConfig(load_factor=load_factor))
    replicas = views(*loads)
    decision = policy.pick(request(*hashes), replicas)
    bound = load_bound(sum(loads), len(loads), load_factor)
    chosen = next(r for r in replicas if r.id == decision.replica_id)
    assert chosen.load + 1 <= bound
    assert sorted(decision.order) == sorted(r.id for r in replicas)
    assert decision.reason in ("hit", "load-fallback")


def test_same_prefix_same_replica_and_deterministic():
    first, second = Chwbl(), Chwbl()
    replicas = views(0, 0, 0, 0)
    for key in range(50):
        a = first.pick(request(1, 2, 3, uniform(key), 99), replicas)
        b = first.pick(request(1, 2, 3, uniform(key), 100), replicas)
        c = second.pick(request(1, 2, 3, uniform(key), 99), replicas)
        assert a.replica_id == b.replica_id == c.replica_id
        assert a.fallbacks == c.fallbacks


def test_key_is_the_hash_of_the_first_k_blocks():
    policy = Chwbl(ChwblConfig(prefix_blocks=2))
    assert policy.routing_key(request(10, 20, 30)) == 20
    assert policy.routing_key(request(10)) == 10
    short = policy.routing_key(RouteRequest(model="m", session_key="s"))
    assert short == policy.routing_key(RouteRequest(model="m", session_key="s"))
    assert short != policy.routing_key(RouteRequest(model="m", session_key="t"))


def test_keys_spread_over_replicas():
    policy = Chwbl()
    replicas = views(0, 0, 0, 0)
    owners = [policy.pick(request(uniform(key)), replicas).replica_id for key in range(400)]
    counts = [owners.count(r.id) for r in replicas]
    assert min(counts) > 50


def test_a_loaded_replica_spills_to_the_next_on_the_ring():
    policy = Chwbl()
    calm = views(0, 0, 0, 0)
    home = policy.pick(request(uniform(42)), calm)
    assert home.reason == "hit"
    loads = [20 if r.id == home.replica_id else 0 for r in calm]
    spilled = policy.pick(request(uniform(42)), views(*loads))
    assert spilled.reason == "load-fallback"
    assert spilled.replica_id == home.fallbacks[0]


def test_removing_a_replica_moves_only_its_keys():
    policy = Chwbl()
    everyone = views(0, 0, 0, 0)
    before = {key: policy.pick(request(uniform(key)), everyone).replica_id for key in range(200)}
    without = [r for r in everyone if r.id != "r2"]
    for key, owner in before.items():
        after = policy.pick(request(uniform(key)), without).replica_id
        if owner != "r2":
            assert after == owner


def test_unhealthy_replicas_are_never_chosen():
    policy = Chwbl()
    replicas = [ReplicaView(id="a", healthy=False), ReplicaView(id="b")]
    for key in range(20):
        decision = policy.pick(request(key), replicas)
        assert decision.order == ("b",)
    with pytest.raises(NoReplicaAvailable):
        policy.pick(request(1), [ReplicaView(id="a", healthy=False)])


def test_options_are_strict():
    registry = default_registry()
    policy = registry.create("chwbl", {"prefix_blocks": 2, "virtual_nodes": 10, "load_factor": 1.5})
    assert isinstance(policy, Chwbl) and policy.config.prefix_blocks == 2
    with pytest.raises(ValueError):
        registry.create("chwbl", {"replication": 10})
    with pytest.raises(ValueError):
        registry.create("chwbl", {"load_factor": 0.5})
