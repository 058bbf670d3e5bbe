"""Offline replay: cache-aware policies against round robin and the ideal bound."""

from __future__ import annotations

import random

import pytest

from policies.hashing import block_hashes, chain_seed
from policies.registry import default_registry
from policies.simulate import (
    LruBlockCache,
    ManualClock,
    ReplayReplica,
    SimRequest,
    SimResult,
    ideal_bound,
    simulate,
)
from policies.types import RouteRequest

BLOCK = 16
SEED = chain_seed("m", None)
REPLICAS = [ReplayReplica(id=f"r{i}", block_capacity=300) for i in range(4)]


def shared_prefix_stream(
    groups: int = 12, per_group: int = 40, prefix_tokens: int = 1024, seed: int = 1
) -> list[SimRequest]:
    """Requests sharing one of ``groups`` long system prompts, each with its own question.

    The groups' prefixes (768 blocks) overflow any one replica's cache (300)
    but fit in all four together (1200): only routing by prefix can keep them.
    """
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 150_000) for _ in range(prefix_tokens)] for _ in range(groups)]
    order = [group for group in range(groups) for _ in range(per_group)]
    rng.shuffle(order)
    stream, now = [], 0.0
    for index, group in enumerate(order):
        now += rng.expovariate(20.0)
        tokens = tuple(prefixes[group] + [rng.randrange(1, 150_000) for _ in range(200)])
        request = RouteRequest(
            model="m",
            block_hashes=tuple(block_hashes(tokens, BLOCK, SEED)),
            prompt_tokens=len(tokens),
            block_size=BLOCK,
            request_id=str(index),
        )
        stream.append(SimRequest(now, request, rng.randrange(20, 200), tokens))
    return stream


def run(name: str, stream: list[SimRequest], **options: object) -> SimResult:
    clock = ManualClock()
    policy = default_registry(clock=clock).create(name, options)
    sink = None
    events = policy.event_consumer()
    if events is not None:
        for replica in REPLICAS:
            events.set_seed(replica.id, SEED)
        sink = events.apply_events
    return simulate(policy, stream, REPLICAS, clock, event_sink=sink)


@pytest.fixture(scope="module")
def stream() -> list[SimRequest]:
    return shared_prefix_stream()


@pytest.mark.parametrize(
    "name, options",
    [
        ("prefix", {}),
        ("precise", {}),
        ("prefix", {"scorer": "threshold"}),
        ("precise", {"scorer": "threshold"}),
    ],
)
def test_cache_aware_policies_approach_the_ideal_bound(stream, name, options):
    baseline = run("round_robin", stream).hit_rate
    ideal = ideal_bound(stream, REPLICAS)
    result = run(name, stream, **options)
    assert baseline < 0.35
    assert result.hit_rate > 2 * baseline
    assert result.hit_rate > ideal - 0.08
    assert result.mean_ttft_seconds < run("round_robin", stream).mean_ttft_seconds


def test_chwbl_beats_round_robin(stream):
    assert run("chwbl", stream).hit_rate > 2 * run("round_robin", stream).hit_rate


@pytest.mark.parametrize("name", ["round_robin", "least_load", "chwbl", "prefix", "precise"])
def test_no_replica_gets_much_more_than_its_share(stream, name):
    requests = run(name, stream).requests_by_replica
    mean = sum(requests.values()) / len(requests)
    assert max(requests.values()) <= 1.5 * mean


def test_replay_is_deterministic(stream):
    assert run("precise", stream) == run("precise", stream)
    assert run("prefix", stream, session_affinity=True) == run(
        "prefix", stream, session_affinity=True
    )


def test_reasons_are_counted(stream):
    result = run("prefix", stream)
    assert sum(result.reasons.values()) == len(stream)
    assert result.reasons["hit"] > result.reasons.get("miss", 0)


def test_lru_block_cache_matches_leading_runs_and_evicts_tails_first():
    cache = LruBlockCache(3)
    stored, evicted = cache.admit([1, 2, 3, 4])
    assert stored == [0, 1, 2, 3] and evicted == [4]
    assert cache.cached_prefix([1, 2, 3, 4]) == 3
    assert cache.admit([1, 9]) == ([1], [3])


def test_ideal_bound_is_one_big_cache():
    request = RouteRequest(model="m", block_hashes=(1, 2), prompt_tokens=32)
    stream = [SimRequest(float(i), request) for i in range(4)]
    assert ideal_bound(stream, [ReplayReplica("a", 1), ReplayReplica("b", 1)]) == pytest.approx(0.75)


def test_salted_requests_are_found_through_their_salted_events():
    """A salted request's block 0 event carries the salt: precise (no speculation)
    finds the blocks for the same salt only."""
    tokens = tuple(range(1, 1 + 8 * BLOCK))

    def request(index: int, salt: str | None) -> SimRequest:
        hashes = tuple(block_hashes(tokens, BLOCK, chain_seed("m", salt)))
        route = RouteRequest(model="m", block_hashes=hashes, prompt_tokens=len(tokens),
                             block_size=BLOCK, request_id=str(index))  # fmt: skip
        return SimRequest(float(index), route, 4, tokens, cache_salt=salt)

    clock = ManualClock()
    policy = default_registry(clock=clock).create("precise", {"speculative_ttl_seconds": 0})
    events = policy.event_consumer()
    assert events is not None
    for replica in REPLICAS:
        events.set_model(replica.id, "m")
    stream = [request(0, "t"), request(1, "t"), request(2, None), request(3, "u")]
    result = simulate(policy, stream, REPLICAS, clock, event_sink=events.apply_events)
    hits = sum(s.hit_tokens for s in result.replicas.values())
    assert hits == len(tokens)  # the second "t" request went where its blocks were
    assert result.reasons == {"hit": 1, "miss": 3}  # no salt and "u" found nothing
    assert sum(events.stats(r.id).salted_roots for r in REPLICAS) == 2  # type: ignore[attr-defined]
