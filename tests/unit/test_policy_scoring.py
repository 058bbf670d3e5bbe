"""The two scorers: cost (TTFT estimate) and threshold (sgl-router style)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.cost_scorer import CostConfig, CostScorer, estimated_ttft
from policies.registry import default_registry
from policies.scoring import Candidates
from policies.sessions import SessionTable
from policies.threshold_scorer import ThresholdConfig, ThresholdScorer
from policies.types import Decision, ReplicaView, RouteRequest

PROMPT = RouteRequest(model="m", block_hashes=tuple(range(64)), prompt_tokens=1030, block_size=16)


def replica(rid: str, **load: float) -> ReplicaView:
    return ReplicaView(id=rid, **load)  # type: ignore[arg-type]


def decide(request: RouteRequest, replicas: list[ReplicaView], matched: dict[str, int],
           session: str | None, options: dict[str, Any], rotation: int) -> Decision:
    """What a cache-aware policy with these options decides (its session lookup given)."""
    options = dict(options)
    kind = options.pop("scorer", "cost")
    affinity = options.pop("session_affinity", False)
    scorer = (CostScorer(CostConfig(**options)) if kind == "cost"
              else ThresholdScorer(ThresholdConfig(**options)))
    return scorer.rank(request, Candidates.of(replicas, matched,
                                              session if affinity else None, rotation))


def test_cost_is_queue_plus_uncached_prefill_plus_kv_pressure():
    config = CostConfig()
    idle = replica("a")
    assert estimated_ttft(idle, 0, PROMPT, config) == pytest.approx(1030 * 1e-4)
    assert estimated_ttft(idle, 64, PROMPT, config) == pytest.approx(6 * 1e-4)
    busy = replica("a", inflight=7, waiting=2, running=4, kv_usage=0.95)
    # each running request: 2 ms on the first token, 0.2 ms on each of the answer's
    # decode steps (an unknown answer counts 32 tokens)
    per_running = config.running_request_seconds + 32 * config.decode_seconds_per_sequence
    expected = 5 * per_running + 2 * 0.1 + 1030 * 1e-4 + 0.5 * 1.0
    assert estimated_ttft(busy, 0, PROMPT, config) == pytest.approx(expected)
    long_answer = dataclasses.replace(PROMPT, output_tokens=1000)   # counts the cap of 128
    longer = 5 * (config.running_request_seconds + 128 * config.decode_seconds_per_sequence)
    assert estimated_ttft(busy, 0, long_answer, config) == pytest.approx(
        expected - 5 * per_running + longer)


def test_cost_keeps_affinity_under_moderate_load():
    replicas = [replica("a", inflight=6), replica("b", inflight=2), replica("c", inflight=3)]
    decision = decide(PROMPT, replicas, {"a": 64}, None, {}, rotation=0)
    assert decision.replica_id == "a"
    assert decision.reason == "hit"
    assert decision.fallbacks == ("b", "c")
    assert decision.matched_blocks == {"a": 64, "b": 0, "c": 0}


def test_cost_moves_off_a_hot_replica():
    replicas = [replica("a", inflight=30, running=20, waiting=10), replica("b", inflight=2)]
    decision = decide(PROMPT, replicas, {"a": 64}, None, {}, rotation=0)
    assert decision.replica_id == "b"
    assert decision.reason == "load-fallback"
    assert decision.fallbacks == ("a",)


def test_a_burst_spreads_while_a_replica_is_idle():
    # The first request of a new prefix is prefilling on a; b has nothing queued: the
    # next request of that prefix pays its own prefill on b rather than wait.
    replicas = [replica("a", inflight=1, pending_requests=1, pending_prefill_tokens=1030),
                replica("b")]
    decision = decide(PROMPT, replicas, {"a": 64, "b": 0}, None, {}, rotation=0)
    assert decision.replica_id == "b"


def test_with_every_replica_busy_a_request_joins_the_replica_prefilling_its_prefix():
    # a prefills this prefix (and another prompt), b a prompt of its own: by its own
    # estimate the request is a hair faster on b, but there it adds 1,024 tokens of
    # prefill that b's next requests wait for. It joins a; without the spill's price
    # (weight 0) it would go to b.
    replicas = [replica("a", inflight=2, pending_requests=2, pending_prefill_tokens=2060),
                replica("b", inflight=1, pending_requests=1, pending_prefill_tokens=1030)]
    matched = {"a": 64, "b": 0}
    decision = decide(PROMPT, replicas, matched, None, {}, rotation=1)
    assert decision.replica_id == "a"
    assert decision.reason == "hit"
    assert decision.scores["b"] < decision.scores["a"]  # the scores stay TTF estimates
    assert decide(PROMPT, replicas, matched, None, {"spill_prefill_weight": 0.0},
                  rotation=1).replica_id == "b"


def test_a_session_is_not_named_the_reason_when_the_spill_price_decided():
    # The same close call, a being the session's replica: the spill's price alone
    # keeps the request on a, so the reason is the hit, not the session discount.
    replicas = [replica("a", inflight=2, pending_requests=2, pending_prefill_tokens=2060),
                replica("b", inflight=1, pending_requests=1, pending_prefill_tokens=1030)]
    decision = decide(PROMPT, replicas, {"a": 64, "b": 0}, "a",
                      {"session_affinity": True}, rotation=1)
    assert (decision.replica_id, decision.reason) == ("a", "hit")


def test_with_every_replica_busy_a_much_longer_queue_still_spills():
    replicas = [replica("a", inflight=6, pending_requests=6, pending_prefill_tokens=6000),
                replica("b", inflight=1, pending_requests=1, pending_prefill_tokens=1030)]
    decision = decide(PROMPT, replicas, {"a": 64, "b": 0}, None, {}, rotation=0)
    assert decision.replica_id == "b"
    assert decision.reason == "load-fallback"


def test_a_replica_is_not_priced_by_how_early_its_requests_got_their_first_token():
    # Mid-burst (vllm bench serve, 1,000 prompts at once): a's requests came back with
    # their first tokens sooner, so more of its 150 are confirmed; b holds 200, most of
    # them still unconfirmed though their prefill is drained by the estimate. All of them
    # will share the engine's steps with this request's decode: the replica with fewer
    # goes first.
    replicas = [replica("a", inflight=150, running=30, waiting=120, pending_requests=120,
                        prefilled_requests=120),
                replica("b", inflight=200, running=10, waiting=190, pending_requests=190,
                        prefilled_requests=182, pending_prefill_tokens=500)]
    decision = decide(PROMPT, replicas, {"a": 64, "b": 64}, None, {}, rotation=1)
    assert decision.replica_id == "a"
    assert decision.scores["a"] < decision.scores["b"]


def test_a_request_still_prefilling_costs_its_prefill_not_also_a_running_slot():
    # A burst just sent: a queues 8 prefilling requests (1,600 tokens left), b 9 (1,700).
    # A request still prefilling by the estimate is priced by its tokens only, so the
    # difference is the 100 tokens, not nine running slots against eight on top.
    replicas = [replica("a", inflight=8, waiting=8, pending_requests=8,
                        pending_prefill_tokens=1600),
                replica("b", inflight=9, waiting=9, pending_requests=9,
                        pending_prefill_tokens=1700)]
    decision = decide(PROMPT, replicas, {"a": 64, "b": 64}, None, {}, rotation=1)
    assert decision.scores["b"] - decision.scores["a"] == pytest.approx(100 * 1e-4)


def test_cost_avoids_a_replica_whose_kv_cache_is_full():
    replicas = [replica("a", kv_usage=1.0), replica("b", inflight=3)]
    decision = decide(PROMPT, replicas, {"a": 64}, None, {}, rotation=0)
    assert decision.replica_id == "b"


def test_equal_replicas_take_turns():
    replicas = [replica("a"), replica("b"), replica("c")]
    chosen = [decide(PROMPT, replicas, {}, None, {}, rotation=i) for i in range(6)]
    assert [d.replica_id for d in chosen] == ["a", "b", "c", "a", "b", "c"]
    assert {d.reason for d in chosen} == {"miss"}


def test_session_discount_decides_close_calls_only():
    config = {"session_affinity": True}
    replicas = [replica("a", inflight=2), replica("b", inflight=1)]
    close = decide(PROMPT, replicas, {}, "a", config, rotation=0)
    assert (close.replica_id, close.reason) == ("a", "session")
    overloaded = [replica("a", inflight=10, waiting=8), replica("b", inflight=1)]
    assert decide(PROMPT, overloaded, {}, "a", config, rotation=0).replica_id == "b"
    unhealthy = [replica("a", healthy=False), replica("b", inflight=1)]
    assert decide(PROMPT, unhealthy, {}, "a", config, rotation=0).order == ("b",)
    off = decide(PROMPT, replicas, {}, "a", {}, rotation=0)
    assert off.replica_id == "b"


def test_threshold_routes_hits_to_the_best_match():
    config = {"scorer": "threshold"}
    replicas = [replica("a", inflight=9), replica("b", inflight=2), replica("c")]
    decision = decide(PROMPT, replicas, {"a": 60, "b": 10}, None, config, rotation=0)
    assert (decision.replica_id, decision.reason) == ("a", "hit")
    assert decision.fallbacks == ("b", "c")
    assert decision.scores["a"] == pytest.approx(960 / 1030)


def test_threshold_sends_small_matches_to_the_least_loaded():
    config = {"scorer": "threshold"}
    replicas = [replica("a", inflight=9), replica("b", inflight=2)]
    decision = decide(PROMPT, replicas, {"a": 20}, None, config, rotation=0)
    assert (decision.replica_id, decision.reason) == ("b", "miss")
    with_session = {"scorer": "threshold", "session_affinity": True}
    decision = decide(PROMPT, replicas, {"a": 20}, "a", with_session, rotation=0)
    assert (decision.replica_id, decision.reason) == ("a", "session")


def test_threshold_balances_when_load_is_imbalanced():
    config = {"scorer": "threshold"}
    replicas = [replica("a", inflight=100), replica("b", inflight=30)]
    decision = decide(PROMPT, replicas, {"a": 64}, None, config, rotation=0)
    assert (decision.replica_id, decision.reason) == ("b", "load-fallback")
    within_relative = [replica("a", inflight=100), replica("b", inflight=70)]
    assert decide(PROMPT, within_relative, {"a": 64}, None, config, rotation=0).replica_id == "a"


def test_config_is_validated():
    registry = default_registry(clock=lambda: 0.0)
    with pytest.raises(ValueError, match="scorer must be one of"):
        registry.create("prefix", {"scorer": "fastest"})
    with pytest.raises(ValueError):
        registry.create("prefix", {"prefill_seconds_per_token": -1.0})
    with pytest.raises(ValueError):
        registry.create("precise", {"kv_pressure_threshold": 1.0})
    # each scorer takes only its own options
    with pytest.raises(ValueError, match="unknown option.*cache_threshold"):
        registry.create("prefix", {"cache_threshold": 0.3})
    with pytest.raises(ValueError, match="unknown option.*running_request_seconds"):
        registry.create("prefix", {"scorer": "threshold", "running_request_seconds": 0.1})
    with pytest.raises(ValueError, match="unknown option.*index_ttl_seconds"):
        registry.create("precise", {"index_ttl_seconds": 5.0})


def test_session_table_is_bounded_and_ages():
    sessions = SessionTable(ttl_seconds=10.0, max_sessions=2)
    sessions.remember("s1", "a", now=0.0)
    sessions.remember("s2", "b", now=1.0)
    sessions.remember("s3", "a", now=2.0)
    assert len(sessions) == 2 and sessions.get("s1", now=2.0) is None
    assert sessions.get("s2", now=11.0) == "b"
    assert sessions.get("s2", now=11.5) is None
    sessions.forget_replica("a")
    assert sessions.get("s3", now=3.0) is None


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40), st.integers(0, 10),
                          st.floats(0.0, 1.0), st.integers(0, 80),
                          st.tuples(st.integers(0, 12), st.integers(0, 12),
                                    st.integers(0, 4000))), min_size=1, max_size=12),
       st.integers(1, 3000), st.integers(0, 5))
def test_the_cost_ranking_scores_are_the_estimated_ttft(
        loads: list[tuple[int, int, int, float, int, tuple[int, int, int]]], prompt_tokens: int,
        rotation: int) -> None:
    """The scorer inlines ``estimated_ttft`` for speed; the two must never disagree."""
    replicas = [replica(f"r{i}", inflight=a, running=b, waiting=c + min(p, a), kv_usage=kv,
                        pending_requests=min(p, a), prefilled_requests=min(q, p, a),
                        pending_prefill_tokens=tokens if min(p, a) > min(q, p, a) else 0)
                for i, (a, b, c, kv, _, (p, q, tokens)) in enumerate(loads)]
    matched = {f"r{i}": m for i, (_, _, _, _, m, _) in enumerate(loads)}
    request = RouteRequest(model="m", block_hashes=tuple(range(64)),
                           prompt_tokens=prompt_tokens, block_size=16)
    config = CostConfig()
    decision = CostScorer(config).rank(request, Candidates.of(replicas, matched, None, rotation))
    for view in replicas:
        assert decision.scores[view.id] == pytest.approx(
            estimated_ttft(view, matched[view.id], request, config), abs=1e-12)
    # The ranking is by the score, plus (every replica busy: the gateway's unconfirmed
    # prefill, or another client's queue) the prefill a candidate adds beyond the best's.
    busy = len(replicas) > 1 and all(
        view.pending_prefill_tokens or view.waiting > view.pending_requests for view in replicas)
    uncached = {view.id: prompt_tokens - min(prompt_tokens, matched[view.id] * 16)
                for view in replicas}
    extra = config.spill_prefill_weight * config.prefill_seconds_per_token if busy else 0.0

    def key(view: ReplicaView) -> float:
        return decision.scores[view.id] + (uncached[view.id] - min(uncached.values())) * extra

    best = min(replicas, key=key)
    assert key(replicas[[v.id for v in replicas].index(decision.replica_id)]) == \
        pytest.approx(key(best), abs=1e-12)
