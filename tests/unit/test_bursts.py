"""Bursts through the cache-aware policies (offline replay): in-flight prefixes are seen.

A burst is many requests decided in the same instant, as ``vllm bench serve``
sends them by default. The policy must spread the prefill of a new prefix
while it is the bottleneck, predict what each request will find (a prefix
still being prefilled on its replica included), and still spread
conversations that share a system prompt.
"""

from __future__ import annotations

import random

import pytest

from policies.block_table import BlockTableFactory, default_tables, python_tables
from policies.hashing import block_hashes, chain_seed
from policies.pending import PendingPrefixes
from policies.registry import default_registry
from policies.simulate import ManualClock, ReplayReplica, SimRequest, SimResult, simulate
from policies.types import ReplicaView, RouteRequest

BLOCK = 16
SEED = chain_seed("m", None)
REPLICAS = [ReplayReplica(id=f"r{i}", block_capacity=4096) for i in range(4)]


def request_of(tokens: list[int], request_id: str) -> RouteRequest:
    return RouteRequest(model="m", block_hashes=tuple(block_hashes(tokens, BLOCK, SEED)),
                        prompt_tokens=len(tokens), block_size=BLOCK, request_id=request_id)


def burst(size: int, prefixes: int, prefix_len: int, suffix_len: int, rng: random.Random,
          at: float = 0.0) -> list[SimRequest]:
    shared = [[rng.randrange(1, 150_000) for _ in range(prefix_len)] for _ in range(prefixes)]
    out = []
    for i in range(size):
        tokens = shared[i % prefixes] + [rng.randrange(1, 150_000) for _ in range(suffix_len)]
        out.append(SimRequest(at, request_of(tokens, f"{at}-{i}"), 64, tuple(tokens)))
    return out


def run(name: str, stream: list[SimRequest]) -> SimResult:
    clock = ManualClock()
    policy = default_registry(clock=clock).create(name, {})
    sink = None
    events = policy.event_consumer()
    if events is not None:
        for replica in REPLICAS:
            events.set_seed(replica.id, SEED)
        sink = events.apply_events
    return simulate(policy, stream, REPLICAS, clock, event_sink=sink)


def max_over_mean(result: SimResult) -> float:
    counts = list(result.requests_by_replica.values())
    return max(counts) / (sum(counts) / len(counts))


@pytest.mark.parametrize("name", ["prefix", "precise"])
@pytest.mark.parametrize("prefixes, prefix_len, suffix_len",
                         [(1, 512, 32), (1, 4096, 64), (3, 1024, 128), (8, 256, 256)])
def test_a_burst_spreads_and_its_predictions_hold(name: str, prefixes: int, prefix_len: int,
                                                  suffix_len: int) -> None:
    result = run(name, burst(100, prefixes, prefix_len, suffix_len, random.Random(prefix_len)))
    assert max_over_mean(result) <= 1.6, result.requests_by_replica
    # every request but the first on each replica (per prefix) reuses the prefix
    assert result.hit_rate > 0.8 * prefix_len / (prefix_len + suffix_len)
    assert 0.9 <= result.predicted_hit_ratio <= 1.1


@pytest.mark.parametrize("name", ["prefix", "precise"])
@pytest.mark.parametrize("spacing", [0.0005, 0.002, 0.01])
def test_a_burst_arriving_slower_than_its_prefill_does_not_pile_onto_one_replica(
        name: str, spacing: float) -> None:
    """The first replica confirms the prefix while the burst is still arriving (a busy
    gateway, a slow client): it is then the cheapest for everyone after."""
    rng = random.Random(int(spacing * 1e4))
    stream = [SimRequest(i * spacing, item.request, 256, item.token_ids)
              for i, item in enumerate(burst(200, 1, 1024, 32, rng))]
    result = run(name, stream)
    assert max_over_mean(result) <= 1.6, result.requests_by_replica
    assert 0.9 <= result.predicted_hit_ratio <= 1.1


@pytest.mark.parametrize("name", ["prefix", "precise"])
def test_repeated_bursts_of_the_same_prefix_find_it_cached(name: str) -> None:
    rng = random.Random(7)
    first = burst(100, 1, 1024, 32, rng)
    again = [SimRequest(30.0, item.request, item.decode_tokens, item.token_ids)
             for item in first]
    result = run(name, first + again)
    assert max_over_mean(result) <= 1.6
    assert 0.9 <= result.predicted_hit_ratio <= 1.1


@pytest.mark.parametrize("name", ["prefix", "precise"])
def test_conversations_sharing_a_system_prompt_still_spread(name: str) -> None:
    """12 users start at once behind one system prompt; each turn extends its history."""
    rng = random.Random(11)
    system = [rng.randrange(1, 150_000) for _ in range(512)]
    histories = {user: list(system) for user in range(12)}
    stream = []
    for turn in range(5):
        for user in range(12):
            histories[user] += [rng.randrange(1, 150_000) for _ in range(128)]
            tokens = list(histories[user])
            stream.append(SimRequest(turn * 10.0, request_of(tokens, f"u{user}-t{turn}"), 64,
                                     tuple(tokens)))
            histories[user] += [rng.randrange(1, 150_000) for _ in range(64)]  # the answer
    result = run(name, stream)
    assert max_over_mean(result) <= 1.6, result.requests_by_replica
    assert all(count > 0 for count in result.requests_by_replica.values())


@pytest.mark.parametrize("tables", [python_tables, default_tables])
def test_pending_prefixes_match_leading_blocks_per_replica(tables: BlockTableFactory) -> None:
    pending = PendingPrefixes(tables)
    long, other = tuple(range(1, 11)), (1, 2, 3, 99)
    pending.add("a", long)
    pending.add("b", long[:4])
    pending.add("b", long[:4])
    assert pending.match(long) == {"a": 10, "b": 4}
    assert pending.match(other) == {"a": 3, "b": 3}
    assert pending.match((99,)) == {}
    pending.discard("b", long[:4])
    assert pending.match(long) == {"a": 10, "b": 4}       # the other request still holds them
    pending.discard("b", long[:4])
    pending.discard("a", long)
    assert pending.match(long) == {} and pending.size("a") == 0
    pending.discard("a", long)                               # a second discard changes nothing
    assert pending.match(long) == {}
    pending.add("c", other)                                  # slots given back are taken again
    pending.add("c", other[:2])
    assert pending.match(long) == {"c": 3} and pending.size("c") == 6
    pending.discard("c", other)
    assert pending.match(other) == {"c": 2} and pending.size("c") == 2


def test_the_bounded_load_holds_a_crowded_replica_back_but_not_a_lightly_loaded_one() -> None:
    clock = ManualClock()
    # without the decode term, so that the bound alone is what holds r0 back
    policy = default_registry(clock=clock).create("prefix", {"decode_seconds_per_sequence": 0})
    prompt = request_of(list(range(1, 1025)), "warm")
    policy.sent(prompt, "r0")
    policy.prefilled(prompt, "r0")
    light = [ReplicaView(id="r0", inflight=6), ReplicaView(id="r1"), ReplicaView(id="r2")]
    assert policy.pick(prompt, light).replica_id == "r0"            # under the floor of 8
    crowded = [ReplicaView(id="r0", inflight=30), ReplicaView(id="r1", inflight=10),
               ReplicaView(id="r2", inflight=10)]
    decision = policy.pick(prompt, crowded)                         # 31 > 1.5 x 51 / 3
    assert decision.replica_id != "r0" and decision.reason == "load-fallback"
    assert decision.fallbacks[-1] == "r0"
    assert decision.matched_blocks["r0"] == 64
    unbounded = default_registry(clock=clock).create("prefix", {"load_factor": 0,
                                                              "decode_seconds_per_sequence": 0})
    unbounded.sent(prompt, "r0")
    unbounded.prefilled(prompt, "r0")
    assert unbounded.pick(prompt, crowded).replica_id == "r0"
