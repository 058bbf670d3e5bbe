"""precise: routing on the replicas' own KV events, with speculation in between."""

from __future__ import annotations

from policies.events import BlockStored, EventBatch
from policies.hashing import block_hashes, chain_seed
from policies.precise import KVEventConsumer, PrecisePolicy
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


def route(policy: PrecisePolicy, request: RouteRequest) -> Decision:
    decision = policy.pick(request, IDLE)
    policy.observe(request, decision)
    return decision


def make(clock: ManualClock, **options: object) -> PrecisePolicy:
    policy = default_registry(clock=clock).create("precise", options)
    assert isinstance(policy, PrecisePolicy)
    for replica in IDLE:
        policy.set_seed(replica.id, SEED)
    return policy


def test_events_steer_requests_to_the_replica_that_stored_the_prefix():
    policy = make(ManualClock(), speculative_ttl_seconds=0.0)
    stored = BlockStored(
        block_hashes=tuple(range(900, 920)),
        parent_block_hash=None,
        token_ids=tuple(TOKENS[: 16 * 20]),
        block_size=16,
    )
    policy.apply_events("b", EventBatch(seq=0, timestamp=0.0, events=(stored,)))
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


def test_it_offers_the_event_consumer_interface():
    policy = make(ManualClock())
    assert isinstance(policy, KVEventConsumer)
