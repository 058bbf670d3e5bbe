"""Rolling per-replica numbers of the ops view, read from a metrics registry, driven by a
hand-moved clock."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gateway.ops.stats import OpsStats, ReplicaReading, Totals, bucket_quantile, read_registry


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Series:
    """The series the ops view reads, in a registry of their own, named as the gateway's."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("prefixgate_requests", "", ["model", "replica", "status"],
                                registry=r)
        self.prompt = Counter("prefixgate_prompt_tokens", "", ["replica"], registry=r)
        self.predicted = Counter("prefixgate_predicted_cached_tokens", "", ["replica"],
                                 registry=r)
        self.completion = Counter("prefixgate_completion_tokens", "", ["replica"], registry=r)
        self.ttft = Histogram("prefixgate_time_to_first_token_seconds", "", ["replica"],
                              buckets=(0.1, 0.5, 1.0, 10.0), registry=r)
        self.running = Gauge("prefixgate_replica_running_requests", "", ["replica"], registry=r)
        self.healthy = Gauge("prefixgate_replica_healthy", "", ["replica"], registry=r)
        # The replica's own counters (exported by the pool's collector): they can fall.
        self.hits = Gauge("prefixgate_replica_prefix_cache_hits_tokens_total", "", ["replica"],
                          registry=r)
        self.queries = Gauge("prefixgate_replica_prefix_cache_queries_tokens_total", "",
                             ["replica"], registry=r)

    def served(self, replica: str = "a", prompt: int = 100, predicted: int = 0,
               status: int = 200, ttft: float | None = None, output: int = 0) -> None:
        self.requests.labels("m", replica, str(status)).inc()
        if status == 200:
            self.prompt.labels(replica).inc(prompt)
            self.predicted.labels(replica).inc(predicted)
            self.completion.labels(replica).inc(output)
        if ttft is not None:
            self.ttft.labels(replica).observe(ttft)

    def replica_counters(self, hits: float, queries: float, replica: str = "a") -> None:
        self.hits.labels(replica).set(hits)
        self.queries.labels(replica).set(queries)

    def read(self, *replicas: str) -> list[ReplicaReading]:
        return read_registry(self.registry, replicas or ("a",))


def only(stats: OpsStats, series: Series):
    (result,) = stats.stats(series.read())
    return result


def test_predicted_and_actual_hit_rates_since_start_and_over_the_window() -> None:
    clock, series = Clock(), Series()
    stats = OpsStats(clock=clock, window=60, interval=2)
    # The replica had served traffic before the gateway came up: that is the baseline.
    series.replica_counters(hits=500, queries=1000)
    stats.sample(series.read())
    series.served(prompt=100, predicted=0)
    clock.now += 30
    series.replica_counters(hits=500, queries=1100)
    stats.sample(series.read())
    series.served(prompt=100, predicted=80)
    clock.now += 40  # the first request's sample is now older than the window
    series.replica_counters(hits=590, queries=1200)
    stats.sample(series.read())

    result = only(stats, series)
    assert result.total.predicted_hit_rate == pytest.approx(80 / 200)
    assert result.total.actual_hit_rate == pytest.approx(90 / 200)
    assert result.total.requests == 2
    # At t+70 the newest sample at least 60 s old is the one at t+0: both requests count.
    assert result.window.requests == 2
    clock.now += 25  # t+95: baseline is now the sample at t+30
    result = only(stats, series)
    assert result.window.requests == 1
    assert result.window_s == pytest.approx(65)
    assert result.window.predicted_hit_rate == pytest.approx(0.8)
    assert result.window.actual_hit_rate == pytest.approx(0.9)


def test_rates_are_none_when_nothing_was_looked_up() -> None:
    series = Series()
    stats = OpsStats(clock=Clock())
    stats.sample(series.read())
    result = only(stats, series)
    assert result.window.predicted_hit_rate is None
    assert result.window.actual_hit_rate is None
    assert result.window.quantile("ttft", 0.5) is None


def test_a_replica_restart_is_a_counter_reset_not_a_negative_rate() -> None:
    clock, series = Clock(), Series()
    stats = OpsStats(clock=clock)
    series.replica_counters(hits=900, queries=1000)
    stats.sample(series.read())
    clock.now += 2
    series.replica_counters(hits=950, queries=1100)
    stats.sample(series.read())
    clock.now += 2
    series.replica_counters(hits=10, queries=40)  # restarted, then served 40 tokens
    stats.sample(series.read())
    result = only(stats, series)
    assert result.total.cache_queries == 100 + 40
    assert result.total.cache_hits == 50 + 10


def test_ttft_percentiles_cover_only_the_last_window() -> None:
    clock, series = Clock(), Series()
    stats = OpsStats(clock=clock, window=60)
    stats.sample(series.read())
    for _ in range(10):
        series.served(ttft=9.0)  # slow, and soon out of the window
    clock.now += 1
    stats.sample(series.read())
    clock.now += 61
    for _ in range(100):
        series.served(ttft=0.3)
    result = only(stats, series)
    assert result.window.samples("ttft") == 100
    # Inside the (0.1, 0.5] bucket, as histogram_quantile interpolates it.
    assert result.window.quantile("ttft", 0.5) == pytest.approx(0.3)
    assert result.window.quantile("ttft", 0.99) == pytest.approx(0.496)
    assert result.total.quantile("ttft", 0.99) == pytest.approx(1 + 9 * 8.9 / 10)


def test_errors_count_as_requests_but_not_as_routed_tokens() -> None:
    series = Series()
    stats = OpsStats(clock=Clock())
    stats.sample(series.read())
    series.served(prompt=100, predicted=50)
    series.served(prompt=100, predicted=100, status=502)
    result = only(stats, series)
    assert (result.total.requests, result.total.errors) == (2, 1)
    assert result.total.predicted_hit_rate == pytest.approx(0.5)


def test_output_tokens_per_second_over_the_window() -> None:
    clock, series = Clock(), Series()
    stats = OpsStats(clock=clock, window=60)
    stats.sample(series.read())
    clock.now += 20
    series.served(output=300)
    stats.sample(series.read())
    result = only(stats, series)
    assert result.output_tokens_per_s == pytest.approx(300 / 20)
    assert result.history[-1].output_tokens_per_s == pytest.approx(300 / 20)


def test_each_replica_reads_only_its_own_series() -> None:
    series = Series()
    stats = OpsStats(clock=Clock())
    stats.sample(series.read("a", "b"))
    series.served("a", prompt=10)
    series.served("b", prompt=30)
    series.served("b", prompt=30)
    a, b = stats.stats(series.read("a", "b"))
    assert (a.total.requests, a.total.prompt_tokens) == (1, 10)
    assert (b.total.requests, b.total.prompt_tokens) == (2, 60)


def test_history_is_bounded_and_marks_down_periods() -> None:
    clock, series = Clock(), Series()
    stats = OpsStats(clock=clock, window=60, interval=2, history_seconds=60)
    for step in range(100):
        clock.now += 2
        series.replica_counters(step * 10, step * 20)
        series.healthy.labels("a").set(0 if step % 10 == 0 else 1)
        series.running.labels("a").set(step)
        stats.sample(series.read())
    (result,) = stats.stats(series.read())
    assert len(result.history) == 31
    assert result.history[-1].running == 99
    assert [p.healthy for p in result.history].count(False) == 3
    assert result.history[-1].actual_hit_rate == pytest.approx(0.5)


def test_bucket_quantile_matches_histogram_quantile() -> None:
    buckets = ((1.0, 10.0), (2.0, 30.0), (float("inf"), 40.0))
    assert bucket_quantile(buckets, 0.5) == pytest.approx(1.5)  # rank 20 of 40
    assert bucket_quantile(buckets, 0.1) == pytest.approx(0.4)
    assert bucket_quantile(buckets, 0.99) == 2.0  # in +Inf: the highest finite bound
    assert bucket_quantile((), 0.5) is None
    assert Totals().quantile("ttft", 0.5) is None


def test_output_tokens_count_what_the_replica_generated_when_usage_is_missing() -> None:
    # A stream without stream_options.include_usage carries no usage: the gateway's
    # own counter stays 0, the replica's vllm:generation_tokens does not.
    clock, series = Clock(), Series()
    generated = Gauge("prefixgate_replica_generation_tokens_total", "", ["replica"],
                      registry=series.registry)
    stats = OpsStats(clock=clock, window=60)
    stats.sample(series.read())
    clock.now += 10
    series.served(output=0)
    generated.labels("a").set(250)
    stats.sample(series.read())
    result = only(stats, series)
    assert result.output_tokens_per_s == pytest.approx(25)
    assert result.history[-1].output_tokens_per_s == pytest.approx(25)
