"""The shared routing state's series, read at scrape time from ``FleetSync``.

Registered through ``GatewayMetrics.register`` only when ``redis_url`` is
set (without Redis these series are absent):

* ``prefixgate_redis_up``: 1 while Redis answers, 0 while the gateway serves
  on its local state alone.
* ``prefixgate_redis_published_entries`` / ``_dropped_entries`` /
  ``_applied_entries`` / ``_bad_entries`` (counters): routed requests
  published, dropped (queue full or Redis away), learned from other
  instances, and stream entries that could not be read.
* ``prefixgate_redis_resyncs`` (counter): catch-ups from the snapshot or the
  stream's tail (start-up and each reconnect).
* ``prefixgate_redis_peers``: other instances heard from recently.
* ``prefixgate_redis_remote_inflight{replica}``: other instances' in-flight
  requests, added to the load the policy sees.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.fleet.local import Connections, LocalSync
from gateway.fleet.sync import FleetSync


class FleetCollector(Collector):
    def __init__(self, fleet: FleetSync) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        fleet = self.fleet
        yield GaugeMetricFamily("prefixgate_redis_up",
                                "1 while Redis (shared routing state) answers, else 0.",
                                value=1.0 if fleet.up else 0.0)
        counters = {
            "published_entries": ("Routed requests published to the other instances.",
                                  fleet.published),
            "dropped_entries": ("Routed requests not published (queue full or Redis away).",
                                fleet.dropped),
            "applied_entries": ("Routed requests of other instances learned from.",
                                fleet.applied),
            "bad_entries": ("Stream entries that could not be decoded.", fleet.bad_entries),
            "resyncs": ("Catch-ups from the snapshot or the stream's tail.", fleet.resyncs),
        }
        for name, (text, value) in counters.items():
            yield CounterMetricFamily(f"prefixgate_redis_{name}", text, value=value)
        yield GaugeMetricFamily("prefixgate_redis_peers",
                                "Other gateway instances heard from recently.",
                                value=fleet.peers())
        remote = GaugeMetricFamily("prefixgate_redis_remote_inflight",
                                   "Other instances' requests in flight, per replica.",
                                   labels=["replica"])
        counts = fleet.remote_inflight()
        for replica in fleet.pool:
            remote.add_metric([replica.id], counts.get(replica.id, 0))
        yield remote


def fleet_collectors(fleet: FleetSync | None) -> list[Collector]:
    """What ``GatewayMetrics.register`` takes for the shared routing state."""
    return [] if fleet is None else [FleetCollector(fleet)]


class WorkersCollector(Collector):
    """One worker of several (``--workers N``, ``gateway.fleet.local``)."""

    def __init__(self, siblings: LocalSync, connections: Connections | None = None) -> None:
        self.siblings = siblings
        self.connections = connections

    def collect(self) -> Iterator[Metric]:
        siblings = self.siblings
        yield GaugeMetricFamily("prefixgate_workers_hub_up",
                                "1 while this worker is connected to the supervisor's hub "
                                "(routing state shared with the other workers), else 0.",
                                value=1.0 if siblings.up else 0.0)
        yield CounterMetricFamily("prefixgate_workers_claims",
                                  "Prompts new to every replica that this worker claimed at "
                                  "the hub before sending.", value=siblings.claims)
        yield CounterMetricFamily("prefixgate_workers_claims_followed",
                                  "Of those, the ones another worker had placed a moment "
                                  "before: sent where it sent them.",
                                  value=siblings.claims_followed)
        yield CounterMetricFamily("prefixgate_workers_claims_unanswered",
                                  "Claims the hub did not answer in time (the worker kept its "
                                  "own choice): the hub or this worker's loop is behind.",
                                  value=siblings.claims_unanswered)
        acceptor = self.connections.acceptor if self.connections is not None else None
        if acceptor is None:
            return
        yield GaugeMetricFamily("prefixgate_workers_connections",
                                "Client connections this worker holds.", value=acceptor.count)
        yield CounterMetricFamily("prefixgate_workers_connections_left",
                                  "Times this worker left a waiting connection to a worker "
                                  "holding fewer.", value=acceptor.deferred)
        yield CounterMetricFamily("prefixgate_workers_connections_overdue",
                                  "Connections this worker took after the worker holding "
                                  "fewer left them waiting 20 ms: that worker's loop is "
                                  "behind, or it is gone.", value=acceptor.overdue)
        yield CounterMetricFamily("prefixgate_workers_connections_shed",
                                  "Connections this worker closed after an answer "
                                  "(Connection: close) because it held more than its share.",
                                  value=acceptor.shed)


def worker_collectors(siblings: LocalSync | None,
                      connections: Connections | None = None) -> list[Collector]:
    return [] if siblings is None else [WorkersCollector(siblings, connections)]
