"""The trace recorder on ``/metrics``, read at scrape time from the writer.

    prefixgate_trace_lines_total              lines written
    prefixgate_trace_dropped_total{reason}    records lost: queue_full (the writer fell
                                              behind), write_error (the disk refused)
    prefixgate_trace_sampled_out_total        records left out by ``trace.sample``
    prefixgate_trace_rotations_total          times the file was rotated
    prefixgate_trace_bytes                    bytes the trace's files hold now
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.trace.writer import TraceWriter

DROP_REASONS = ("queue_full", "write_error")


class TraceCollector(Collector):
    def __init__(self, writer: TraceWriter) -> None:
        self.writer = writer

    def collect(self) -> Iterator[Metric]:
        w = self.writer
        yield CounterMetricFamily("prefixgate_trace_lines",
                                  "Trace lines written (one per answered prompt-routed request).",
                                  value=float(w.lines))
        dropped = CounterMetricFamily(
            "prefixgate_trace_dropped",
            "Trace records lost: queue_full (the writer thread fell behind), write_error.",
            labels=["reason"])
        for reason in DROP_REASONS:
            dropped.add_metric([reason], float(w.dropped[reason]))
        yield dropped
        yield CounterMetricFamily("prefixgate_trace_sampled_out",
                                  "Trace records left out by trace.sample.",
                                  value=float(w.sampled_out))
        yield CounterMetricFamily("prefixgate_trace_rotations",
                                  "Times the trace file was rotated.", value=float(w.rotations))
        yield GaugeMetricFamily("prefixgate_trace_bytes",
                                "Bytes the trace's files hold on disk now.",
                                value=float(w.disk_bytes()))
