"""The gateway's own saturation, as ``/metrics`` and the ops view show it (``gateway.ops.load``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from gateway.ops.load import GatewayLoad, LoadCollector, read_load


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _registry(cpu: Clock, counts: dict[str, int], lint: bool = True) -> tuple[
        CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    lag = Histogram("prefixgate_event_loop_lag_seconds", "lag",
                    buckets=(0.001, 0.01, 0.1, 1.0), registry=registry)
    registry.register(LoadCollector(lambda: counts["preparing"], lambda: counts["open"],
                                    (lambda: counts["lint"]) if lint else None, cpu_clock=cpu))
    return registry, lag


def _exported(registry: CollectorRegistry) -> dict[str, float]:
    return {s.name: s.value for family in registry.collect() for s in family.samples
            if not s.name.startswith("prefixgate_event_loop_lag")}


def test_the_series_say_how_busy_the_gateway_is_now() -> None:
    cpu = Clock()
    counts = {"preparing": 7, "open": 31, "lint": 2}
    registry, _ = _registry(cpu, counts)
    assert _exported(registry) == {
        "prefixgate_process_cpu_seconds_total": 1000.0, "prefixgate_requests_preparing": 7,
        "prefixgate_requests_open": 31, "prefixgate_lint_queue_requests": 2}
    counts["preparing"] = 0
    assert _exported(registry)["prefixgate_requests_preparing"] == 0  # read when scraped


def test_without_the_live_linter_there_is_no_lint_queue() -> None:
    registry, _ = _registry(Clock(), {"preparing": 0, "open": 0}, lint=False)
    assert "prefixgate_lint_queue_requests" not in _exported(registry)
    assert read_load(registry).lint_queue is None


def test_the_last_minute_gives_cores_used_and_the_loops_lag() -> None:
    cpu, wall = Clock(), Clock()
    counts = {"preparing": 0, "open": 0, "lint": 0}
    registry, lag = _registry(cpu, counts)
    load = GatewayLoad(clock=wall, window=60.0)
    for _ in range(40):  # an idle minute: 5% of a core, no lag
        load.sample(read_load(registry))
        wall.now += 2.0
        cpu.now += 0.1
        lag.observe(0.0005)
    idle = load.summary(read_load(registry))
    assert idle["cpu_cores_1m"] == 0.05 and idle["window_s"] == 60.0
    assert idle["loop_lag_p99_1m_s"] is not None and idle["loop_lag_p99_1m_s"] <= 0.001

    for _ in range(30):  # then a saturated minute: the loop never rests and runs late
        load.sample(read_load(registry))
        wall.now += 2.0
        cpu.now += 1.96
        for _ in range(40):
            lag.observe(0.05)
    counts.update(preparing=12, open=140)
    busy = load.summary(read_load(registry))
    assert busy["cpu_cores_1m"] == 0.98
    assert busy["loop_lag_p99_1m_s"] is not None and busy["loop_lag_p99_1m_s"] > 0.01
    assert (busy["requests_preparing"], busy["requests_open"]) == (12, 140)


def test_a_young_gateway_counts_from_its_first_sample() -> None:
    cpu, wall = Clock(), Clock()
    registry, _ = _registry(cpu, {"preparing": 0, "open": 0, "lint": 0})
    load = GatewayLoad(clock=wall, window=60.0)
    assert load.summary(read_load(registry))["cpu_cores_1m"] is None  # no time has passed
    load.sample(read_load(registry))
    wall.now += 10.0
    cpu.now += 5.0
    summary = load.summary(read_load(registry))
    assert summary["window_s"] == 10.0 and summary["cpu_cores_1m"] == 0.5
