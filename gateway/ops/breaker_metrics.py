"""Each replica's circuit breaker on ``/metrics``, read at scrape time.

    prefixgate_replica_breaker_state{replica, state}   1 for the state it is in
                                                       (closed, open, half_open)
    prefixgate_replica_breaker_open_reason{replica, reason}
                                                       1 while open: failing or slow
    prefixgate_replica_breaker_opened_total{replica}   times it opened
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
        for replica in self.pool:
            now = self.pool.breaker_state(replica.id)
            for each in State:
                state.add_metric([replica.id, each.value], 1.0 if each is now else 0.0)
            if now is State.OPEN:
                reason.add_metric([replica.id, replica.breaker.reason.value], 1.0)
            opened.add_metric([replica.id], float(replica.breaker.opened_count))
        yield state
        yield reason
        yield opened
