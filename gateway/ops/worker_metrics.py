"""One ``/metrics`` for a gateway of several worker processes.

With ``--workers N`` each worker keeps its own registry: its requests, its
latencies, its event loop, its view of the replicas. A scrape lands on one of
them; the supervisor's hub (``gateway.fleet.local``) asks every worker for its
exposition and :func:`merge_expositions` joins them into one: every sample
gets a ``worker`` label (``"0"`` .. ``"N-1"``), each family stays whole.
Nothing is summed here, so nothing is summed wrongly: the gateway's own
counters and histograms add up across workers (``sum without (worker)``),
and what each worker reads from the replicas (their health, their vLLM
counters) is the same replica seen N times (``max without (worker)``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample


class _Merged(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def merge_expositions(texts: Mapping[int, bytes]) -> bytes:
    """The workers' Prometheus texts (by worker index) as one, each sample labelled
    with its worker."""
    families: dict[str, Metric] = {}
    for index in sorted(texts):
        for family in text_string_to_metric_families(texts[index].decode()):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation,
                                                        family.type, family.unit)
            merged.samples.extend(
                Sample(s.name, {**s.labels, "worker": str(index)}, s.value, s.timestamp,
                       s.exemplar) for s in family.samples)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(list(families.values())))
    return generate_latest(registry)
