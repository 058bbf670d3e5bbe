"""Each replica's circuit breaker on ``/metrics``, read at scrape time.

    prefixgate_replica_breaker_state{replica, state}   1 for the state it is in
                                                       (closed, open, half_open)
    prefixgate_replica_breaker_open_reason{replica, reason}
                                                       1 while open: failing or slow
    prefixgate_replica_breaker_opened_total{replica}   times it opened
    prefixgate_replica_broken_checks_total{replica, result}
                                                       health checks a request's broken
                                                       connection started: healthy (it
                                                       stayed in rotation) or failed
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.pool.breaker import State
from engine.pool.replicas import ReplicaPool


class BreakerCollector(Collector):
    def __init__(self, pool: ReplicaPool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "prefixgate_replica_breaker_state",
            "1 for the state the replica's circuit breaker is in (closed: in rotation; "
            "open: out, cooling down; half_open: its one trial may go).",
            labels=["replica", "state"])
        reason = GaugeMetricFamily(
            "prefixgate_replica_breaker_open_reason",
            "1 while the breaker is open, for why: failing (probes, requests) or slow "
            "(time to first token much slower than its peers').", labels=["replica", "reason"])
        opened = CounterMetricFamily(
            "prefixgate_replica_breaker_opened",
            "Times the replica's circuit breaker opened.", labels=["replica"])
        checks = CounterMetricFamily(
            "prefixgate_replica_broken_checks",
            "Health checks started because a request's connection to the replica broke "
            "(reset, closed, a body cut short): healthy (the replica stayed in rotation; the "
            "request's own doing) or failed (the breaker opened).",
            labels=["replica", "result"])
        for replica in self.pool:
            now = self.pool.breaker_state(replica.id)
            for each in State:
                state.add_metric([replica.id, each.value], 1.0 if each is now else 0.0)
            if now is State.OPEN:
                reason.add_metric([replica.id, replica.breaker.reason.value], 1.0)
            opened.add_metric([replica.id], float(replica.breaker.opened_count))
            for result, count in replica.broken_checks.items():
                checks.add_metric([replica.id, result], float(count))
        yield state
        yield reason
        yield opened
        yield checks
