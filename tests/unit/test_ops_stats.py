"""Rolling per-replica numbers of the ops view, driven by a hand-moved clock."""

from __future__ import annotations

import pytest

from gateway.ops_stats import OpsStats, ReplicaReading


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def reading(hits: float, queries: float, replica: str = "a", healthy: bool = True,
            running: int = 0) -> ReplicaReading:
    return ReplicaReading(replica, healthy, inflight=0, running=running, waiting=0,
                          kv_usage=0.25, prefix_hits=hits, prefix_queries=queries)


def only(stats: OpsStats, r: ReplicaReading):
    (result,) = stats.stats([r])
    return result


def test_predicted_and_actual_hit_rates_since_start_and_over_the_window() -> None:
    clock = Clock()
    stats = OpsStats(clock=clock, window=60, interval=2)
    # The replica had served traffic before the gateway came up: that is the baseline.
    stats.sample([reading(hits=500, queries=1000)])
    stats.record("a", prompt_tokens=100, predicted_cached_tokens=0, ttft=0.5, ok=True)
    clock.now += 30
    stats.sample([reading(hits=500, queries=1100)])
    stats.record("a", prompt_tokens=100, predicted_cached_tokens=80, ttft=0.1, ok=True)
    clock.now += 40  # the first request's sample is now older than the window
    stats.sample([reading(hits=590, queries=1200)])

    result = only(stats, reading(hits=590, queries=1200))
    assert result.total.predicted_hit_rate == pytest.approx(80 / 200)
    assert result.total.actual_hit_rate == pytest.approx(90 / 200)
    assert result.total.requests == 2
    # At t+70 the newest sample at least 60 s old is the one at t+0: both requests count.
    assert result.window.requests == 2
    clock.now += 25  # t+95: baseline is now the sample at t+30
    result = only(stats, reading(hits=590, queries=1200))
    assert result.window.requests == 1
    assert result.window.predicted_hit_rate == pytest.approx(0.8)
    assert result.window.actual_hit_rate == pytest.approx(0.9)


def test_rates_are_none_when_nothing_was_looked_up() -> None:
    stats = OpsStats(clock=Clock())
    stats.sample([reading(0, 0)])
    result = only(stats, reading(0, 0))
    assert result.window.predicted_hit_rate is None
    assert result.window.actual_hit_rate is None
    assert result.ttft_p50 is None and result.ttft_p99 is None


def test_a_replica_restart_is_a_counter_reset_not_a_negative_rate() -> None:
    clock = Clock()
    stats = OpsStats(clock=clock)
    stats.sample([reading(hits=900, queries=1000)])
    clock.now += 2
    stats.sample([reading(hits=950, queries=1100)])
    clock.now += 2
    stats.sample([reading(hits=10, queries=40)])  # restarted, then served 40 tokens
    result = only(stats, reading(hits=10, queries=40))
    assert result.total.cache_queries == 100 + 40
    assert result.total.cache_hits == 50 + 10


def test_ttft_percentiles_cover_only_the_last_window() -> None:
    clock = Clock()
    stats = OpsStats(clock=clock, window=60)
    stats.sample([reading(0, 0)])
    for _ in range(10):
        stats.record("a", 10, 0, ttft=9.0, ok=True)  # slow, and soon out of the window
    clock.now += 61
    for i in range(1, 101):
        stats.record("a", 10, 0, ttft=i / 100, ok=True)
    result = only(stats, reading(0, 0))
    assert result.ttft_samples == 100
    assert result.ttft_p50 == pytest.approx(0.50)
    assert result.ttft_p99 == pytest.approx(0.99)


def test_errors_count_as_requests_but_not_as_routed_tokens() -> None:
    stats = OpsStats(clock=Clock())
    stats.sample([reading(0, 0)])
    stats.record("a", 100, 50, ttft=None, ok=True)
    stats.record("a", 100, 100, ttft=None, ok=False)
    result = only(stats, reading(0, 0))
    assert (result.total.requests, result.total.errors) == (2, 1)
    assert result.total.predicted_hit_rate == pytest.approx(0.5)


def test_history_is_bounded_and_marks_down_periods() -> None:
    clock = Clock()
    stats = OpsStats(clock=clock, window=60, interval=2, history_seconds=60)
    for step in range(100):
        clock.now += 2
        stats.sample([reading(step * 10, step * 20, healthy=step % 10 != 0, running=step)])
    (result,) = stats.stats([reading(990, 1980)])
    assert len(result.history) == 31
    assert result.history[-1].running == 99
    assert [p.healthy for p in result.history].count(False) == 3
    assert result.history[-1].actual_hit_rate == pytest.approx(0.5)


def test_the_ttft_ring_is_bounded() -> None:
    stats = OpsStats(clock=Clock(), max_ttft_samples=50)
    for i in range(1000):
        stats.record("a", 1, 0, ttft=float(i), ok=True)
    result = only(stats, reading(0, 0))
    assert result.ttft_samples == 50
    assert result.ttft_p50 == 974.0
