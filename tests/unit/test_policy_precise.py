"""precise: routing on the replicas' own KV events, with speculation in between."""

from __future__ import annotations

from policies.cache_aware import CacheAwarePolicy
from policies.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from policies.hashing import block_hashes, chain_seed
from policies.registry import default_registry
from policies.simulate import ManualClock
from policies.types import Decision, ReplicaView, RouteRequest

SEED = chain_seed("m", None)
TOKENS = list(range(5000, 5000 + 16 * 40))
IDLE = [ReplicaView(id="a"), ReplicaView(id="b"), ReplicaView(id="c")]


def prompt(tokens: list[int]) -> RouteRequest:
    return RouteRequest(
        model="m", block_hashes=tuple(block_hashes(tokens, 16, SEED)), prompt_tokens=len(tokens)
    )


def route(policy: CacheAwarePolicy, request: RouteRequest) -> Decision:
    decision = policy.pick(request, IDLE)
    policy.sent(request, decision.replica_id)
    policy.prefilled(request, decision.replica_id)
    return decision


def make(clock: ManualClock, **options: object) -> CacheAwarePolicy:
    policy = default_registry(clock=clock).create("precise", options)
    assert isinstance(policy, CacheAwarePolicy)
    events = policy.event_consumer()
    assert events is not None
    for replica in IDLE:
        events.set_model(replica.id, "m")
    return policy


def test_events_steer_requests_to_the_replica_that_stored_the_prefix():
    policy = make(ManualClock(), speculative_ttl_seconds=0.0)
    stored = BlockStored(
        block_hashes=tuple(range(900, 920)),
        parent_block_hash=None,
        token_ids=tuple(TOKENS[: 16 * 20]),
        block_size=16,
    )
    events = policy.event_consumer()
    assert events is not None
    events.apply_events("b", EventBatch(seq=0, timestamp=0.0, events=(stored,)))
    for _ in range(3):
        decision = route(policy, prompt(TOKENS))
        assert (decision.replica_id, decision.reason) == ("b", "hit")
        assert decision.matched_blocks == {"a": 0, "b": 20, "c": 0}


def test_speculation_keeps_a_burst_together_until_it_expires():
    clock = ManualClock()
    policy = make(clock)
    first = route(policy, prompt(TOKENS))
    assert first.reason == "miss"
    burst = [route(policy, prompt(TOKENS)).replica_id for _ in range(5)]
    assert burst == [first.replica_id] * 5
    clock.now = 2.5
    assert policy.pick(prompt(TOKENS), IDLE).reason == "miss"


def test_forget_replica_clears_its_blocks():
    policy = make(ManualClock())
    home = route(policy, prompt(TOKENS)).replica_id
    policy.forget_replica(home)
    assert policy.pick(prompt(TOKENS), IDLE).matched_blocks[home] == 0


def test_events_of_a_removal_and_a_clear_take_the_prefix_away():
    policy = make(ManualClock(), speculative_ttl_seconds=0.0)
    events = policy.event_consumer()
    assert events is not None
    engine_hashes = tuple(range(900, 920))
    stored = BlockStored(block_hashes=engine_hashes, parent_block_hash=None,
                         token_ids=tuple(TOKENS[: 16 * 20]), block_size=16)
    events.apply_events("b", EventBatch(seq=0, timestamp=0.0, events=(stored,)))
    assert route(policy, prompt(TOKENS)).replica_id == "b"
    events.apply_events("b", EventBatch(seq=1, timestamp=0.0, events=(
        BlockRemoved(block_hashes=engine_hashes[10:]),)))
    assert policy.pick(prompt(TOKENS), IDLE).matched_blocks["b"] == 10
    events.apply_events("b", EventBatch(seq=2, timestamp=0.0, events=(AllBlocksCleared(),)))
    assert policy.pick(prompt(TOKENS), IDLE).reason == "miss"
    assert policy.indexed_blocks("b") == 0


def test_load_only_policies_take_no_events():
    for name in ("round_robin", "least_load", "chwbl"):
        policy = default_registry(clock=ManualClock()).create(name)
        assert policy.event_consumer() is None and policy.indexed_blocks("a") is None
