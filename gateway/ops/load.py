"""The gateway's own saturation: how busy its process is, and what waits for it.

A replica's load is on every card of the ops view; this is the same for the
gateway itself, so an operator sees when to add workers or instances before
the clients do. Exported (:class:`LoadCollector`, read at scrape time):

* ``prefixgate_process_cpu_seconds_total``: the process's CPU time, every
  thread (``time.process_time``). One serving loop runs on one core at a time,
  so a rate near 1 is a gateway at its ceiling, whatever the machine has;
* ``prefixgate_requests_preparing``: requests arrived and not yet decided
  (their body being read, rendered, tokenized, hashed, routed): the queue in
  front of the gateway's own CPU. It grows when the loop falls behind;
* ``prefixgate_requests_open``: requests the gateway holds now, forwarded or
  streaming (what a drain waits for);
* ``prefixgate_lint_queue_requests``: decided chat requests waiting for the
  live prompt linter's worker (which lints only while nothing is being
  prepared); with 1,024 waiting it drops, counted by
  ``prefixgate_lint_dropped_total``. Absent when live linting is off.

The event loop's lag and the time before a request leaves are histograms of
:class:`gateway.ops.metrics.GatewayMetrics` already. :class:`GatewayLoad`
reads all of it back from the registry (the ops view's one source,
``gateway.ops.stats``) every sample and gives the last minute: CPU in cores,
loop lag p99, time-before-leaving p99, and the gauges as they are now.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.ops.stats import WINDOW_SECONDS, Collected, Totals, families, window_baseline

Count = Callable[[], int]

_GAUGES = {
    "prefixgate_requests_preparing": "preparing",
    "prefixgate_requests_open": "open",
    "prefixgate_lint_queue_requests": "lint_queue",
}
_HISTOGRAMS = {
    "prefixgate_event_loop_lag_seconds_bucket": "loop_lag",
    "prefixgate_overhead_seconds_bucket": "overhead",
}
CPU_SERIES = "prefixgate_process_cpu_seconds_total"
LOAD_SERIES = frozenset({CPU_SERIES, *_GAUGES, *_HISTOGRAMS})
"""The series :func:`read_load` reads (the ops sampler collects only these)."""


class LoadCollector(Collector):
    """The gateway's CPU time and its queues, read when scraped."""

    def __init__(self, preparing: Count, open_requests: Count, lint_queue: Count | None = None,
                 cpu_clock: Callable[[], float] = time.process_time) -> None:
        self.preparing = preparing
        self.open_requests = open_requests
        self.lint_queue = lint_queue
        self.cpu_clock = cpu_clock

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "prefixgate_process_cpu_seconds",
            "CPU seconds the gateway's process used, all its threads: a rate near 1 is one "
            "serving loop at its ceiling.", value=self.cpu_clock())
        yield GaugeMetricFamily(
            "prefixgate_requests_preparing",
            "Requests arrived and not yet decided (body read, render, tokenize, hash, route): "
            "what waits for the gateway's own CPU.", value=self.preparing())
        yield GaugeMetricFamily(
            "prefixgate_requests_open",
            "Requests the gateway holds now, forwarded or streaming.", value=self.open_requests())
        if self.lint_queue is not None:
            yield GaugeMetricFamily(
                "prefixgate_lint_queue_requests",
                "Decided chat requests waiting for the live prompt linter's worker.",
                value=self.lint_queue())


@dataclass(frozen=True, slots=True)
class LoadReading:
    """The gateway's own series as one collection of the registry found them."""

    totals: Totals
    preparing: int = 0
    open: int = 0
    lint_queue: int | None = None


def read_load(registry: Collected) -> LoadReading:
    gauges: dict[str, float] = {}
    counters: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for family in families(registry):
        for sample in family.samples:
            name = sample.name
            if name == CPU_SERIES:
                counters["cpu_seconds"] = sample.value
            elif name in _GAUGES:
                gauges[_GAUGES[name]] = sample.value
            elif name in _HISTOGRAMS:
                buckets.setdefault(_HISTOGRAMS[name], {})[float(sample.labels["le"])] = \
                    sample.value
    lint = gauges.get("lint_queue")
    return LoadReading(Totals(counters, {k: tuple(sorted(v.items())) for k, v in buckets.items()}),
                       preparing=int(gauges.get("preparing", 0)), open=int(gauges.get("open", 0)),
                       lint_queue=None if lint is None else int(lint))


class GatewayLoad:
    """The last minute of the gateway's own load, from samples of the registry."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 window: float = WINDOW_SECONDS, max_samples: int = 256) -> None:
        self.clock = clock
        self.window = window
        self._samples: deque[tuple[float, Totals]] = deque(maxlen=max_samples)

    def sample(self, reading: LoadReading) -> None:
        self._samples.append((self.clock(), reading.totals))

    def summary(self, reading: LoadReading) -> dict[str, Any]:
        """Figures over the last window (since the oldest sample while younger)."""
        now = self.clock()
        at, baseline = self._baseline(now)
        window = reading.totals.minus(baseline)  # the gateway's own series never reset
        seconds = now - at
        cpu = window.count("cpu_seconds")
        return {
            "window_s": round(seconds, 1),
            "cpu_cores_1m": round(cpu / seconds, 3) if seconds > 0 else None,
            "loop_lag_p99_1m_s": _round(window.quantile("loop_lag", 0.99)),
            "overhead_p99_1m_s": _round(window.quantile("overhead", 0.99)),
            "requests_preparing": reading.preparing,
            "requests_open": reading.open,
            "lint_queue": reading.lint_queue,
        }

    def _baseline(self, now: float) -> tuple[float, Totals]:
        return window_baseline(self._samples, now, self.window)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 6)
