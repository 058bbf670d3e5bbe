"""Rolling per-replica numbers for the ops view (``/admin/replicas``, ``/dashboard``).

One source: the gateway's Prometheus registry (``gateway.ops.metrics``). The ops
view reads the same counters and histograms ``/metrics`` exports, so the
dashboard and Grafana cannot disagree on what happened; this module only does
the window arithmetic Prometheus' ``increase`` and ``histogram_quantile`` do
for Grafana.

* ``read_registry(registry)`` turns one collection of the registry into a
  :class:`ReplicaReading` per replica: the load gauges as they are now, and
  cumulative :class:`Totals` — requests and errors, prompt tokens routed and
  those the policy expected cached (the *predicted* hits), output tokens in
  ``usage``, the replica's own prefix-cache counters (the *actual* hits) and
  generated tokens (``vllm:generation_tokens``), and the
  histograms of the gateway's TTFT and TPOT (streams) and of the engine's own
  TTFT and inter-token latency (every request, streamed or not).
* ``sample(readings)`` — every ``interval`` seconds (:mod:`gateway.ops.sampler`)
  — folds them into each replica's totals and keeps a chart point.

Every figure is a difference of cumulative totals. "Over the last minute" is
*now* minus the newest sample at least ``window`` seconds old (or the oldest
one while the gateway is younger than the window); "since start" counts from
the first sample (a replica's counters as first seen are the baseline, so
traffic it served before is left out). A series that falls (the replica
restarted) is taken as a reset: the new value is all increase, as in
``rate``. Quantiles interpolate inside histogram buckets, as
``histogram_quantile`` does.

Output tokens/s counts the replica's own ``vllm:generation_tokens``: every
token it produced, streamed or not. The gateway's ``prefixgate_completion_tokens``
comes from ``usage``, which a stream has only when the client asked for
``stream_options.include_usage`` — not the default of the ``openai`` client
or LangChain — so on it alone the chart read 0 for most streaming apps. Counting
the chunks of every relayed stream would parse what the gateway passes through
untouched, and asking the replica for usage the client did not want would
change the stream the client gets; the replica already counts. (Replicas
that publish no such counter fall back to the gateway's ``usage`` counts.)

Hit rate = hit tokens / looked-up tokens: predicted = predicted cached /
prompt tokens routed; actual = the replica's hits / queries; ``None`` when
nothing was looked up in the window. Memory is bounded by
``history_seconds / interval`` samples and chart points per replica. Time
comes from the injected ``clock``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

WINDOW_SECONDS = 60.0
SAMPLE_INTERVAL_SECONDS = 2.0
HISTORY_SECONDS = 600.0

Buckets = tuple[tuple[float, float], ...]
"""A histogram's cumulative bucket counts, ``(upper bound, count)`` by bound, ``+Inf`` last."""

_COUNTERS = {
    "prefixgate_prompt_tokens_total": "prompt_tokens",
    "prefixgate_predicted_cached_tokens_total": "predicted_cached_tokens",
    "prefixgate_completion_tokens_total": "completion_tokens",
    "prefixgate_replica_prefix_cache_hits_tokens_total": "cache_hits",
    "prefixgate_replica_prefix_cache_queries_tokens_total": "cache_queries",
    "prefixgate_replica_generation_tokens_total": "generation_tokens",
}
_HISTOGRAMS = {
    "prefixgate_time_to_first_token_seconds_bucket": "ttft",
    "prefixgate_time_per_output_token_seconds_bucket": "tpot",
    "prefixgate_replica_time_to_first_token_seconds_bucket": "engine_ttft",
    "prefixgate_replica_inter_token_latency_seconds_bucket": "engine_itl",
}
_GAUGES = {
    "prefixgate_replica_healthy": "healthy",
    "prefixgate_replica_inflight_requests": "inflight",
    "prefixgate_replica_running_requests": "running",
    "prefixgate_replica_waiting_requests": "waiting",
    "prefixgate_replica_kv_cache_usage_ratio": "kv_usage",
}

REQUESTS_SERIES = "prefixgate_requests_total"
REGISTRY_SERIES = frozenset({REQUESTS_SERIES, *_COUNTERS, *_HISTOGRAMS, *_GAUGES})
"""The series :func:`read_registry` reads (the ops sampler collects only these)."""


def _counter(name: str, kind: Callable[[float], Any]) -> Any:
    """A read-only attribute: the named counter of the totals (0 when absent)."""
    return property(lambda totals: kind(totals.count(name)))


@dataclass(frozen=True, slots=True)
class Totals:
    """Cumulative counts of one replica: counters by name, histograms by name."""

    counters: Mapping[str, float] = field(default_factory=dict)
    histograms: Mapping[str, Buckets] = field(default_factory=dict)

    def count(self, name: str) -> float:
        return self.counters.get(name, 0.0)

    requests = _counter("requests", int)
    errors = _counter("errors", int)
    prompt_tokens = _counter("prompt_tokens", int)
    predicted_cached_tokens = _counter("predicted_cached_tokens", int)
    completion_tokens = _counter("completion_tokens", int)
    cache_queries = _counter("cache_queries", float)
    cache_hits = _counter("cache_hits", float)
    generation_tokens = _counter("generation_tokens", float)

    @property
    def output_tokens(self) -> float:
        """Output tokens: the replica's own count when it publishes one, else the
        gateway's (from ``usage``, which a stream carries only with ``include_usage``)."""
        return self.generation_tokens if self.generation_tokens > 0 else self.completion_tokens

    @property
    def predicted_hit_rate(self) -> float | None:
        return _ratio(self.predicted_cached_tokens, self.prompt_tokens)

    @property
    def actual_hit_rate(self) -> float | None:
        return _ratio(self.cache_hits, self.cache_queries)

    def samples(self, histogram: str) -> int:
        """Observations of a histogram (its ``+Inf`` bucket)."""
        buckets = self.histograms.get(histogram, ())
        return int(buckets[-1][1]) if buckets else 0

    def quantile(self, histogram: str, q: float) -> float | None:
        return bucket_quantile(self.histograms.get(histogram, ()), q)

    def minus(self, earlier: Totals) -> Totals:
        return Totals(
            {k: v - earlier.count(k) for k, v in self.counters.items()},
            {k: _combine(v, earlier.histograms.get(k, ()), _minus)
             for k, v in self.histograms.items()})

    def plus_increase(self, previous: Totals, current: Totals) -> Totals:
        """These totals plus what grew from ``previous`` to ``current`` (resets included)."""
        names = set(self.counters) | set(current.counters)
        counters = {k: self.count(k) + _increase(previous.count(k), current.count(k))
                    for k in names}
        histograms = dict(self.histograms)
        for k, buckets in current.histograms.items():
            grown = _combine(buckets, previous.histograms.get(k, ()), _grown)
            histograms[k] = _combine(grown, self.histograms.get(k, ()), _plus)
        return Totals(counters, histograms)


@dataclass(frozen=True, slots=True)
class ReplicaReading:
    """What the registry says about one replica right now."""

    replica_id: str
    healthy: bool = False
    inflight: int = 0
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    raw: Totals = field(default_factory=Totals)
    """Cumulative series as exported (a replica's own may fall when it restarts)."""


Collected = CollectorRegistry | Iterable[Metric]
"""A registry, or the families one collection of it gave (read by several readers)."""


def families(source: Collected) -> Iterable[Metric]:
    return source.collect() if isinstance(source, CollectorRegistry) else source


FROM_THE_REPLICA = frozenset({"healthy", "running", "waiting", "kv_usage", "cache_hits",
                              "cache_queries", "generation_tokens", "engine_ttft",
                              "engine_itl"})
"""What a reading takes from the replica itself: with several workers
(``gateway.ops.worker_readings``) the same figure N times, not N shares."""


def read_registry(registry: Collected,
                  replica_ids: Iterable[str]) -> list[ReplicaReading]:
    """One reading per replica from one collection of the registry."""
    ids = list(replica_ids)
    gauges: dict[str, dict[str, float]] = {r: {} for r in ids}
    counters: dict[str, dict[str, float]] = {r: {} for r in ids}
    buckets: dict[str, dict[str, dict[float, float]]] = {r: {} for r in ids}
    for family in families(registry):
        for sample in family.samples:
            replica = sample.labels.get("replica")
            if replica not in gauges:
                continue
            name, value = sample.name, sample.value
            if name == REQUESTS_SERIES:
                own = counters[replica]
                own["requests"] = own.get("requests", 0.0) + value
                if sample.labels.get("status") != "200":
                    own["errors"] = own.get("errors", 0.0) + value
            elif name in _COUNTERS:
                counters[replica][_COUNTERS[name]] = value
            elif name in _HISTOGRAMS:
                le = float(sample.labels["le"])
                buckets[replica].setdefault(_HISTOGRAMS[name], {})[le] = value
            elif name in _GAUGES:
                gauges[replica][_GAUGES[name]] = value
    out = []
    for r in ids:
        g = gauges[r]
        hists = {k: tuple(sorted(v.items())) for k, v in buckets[r].items()}
        out.append(ReplicaReading(
            r, healthy=g.get("healthy", 0.0) > 0, inflight=int(g.get("inflight", 0)),
            running=int(g.get("running", 0)), waiting=int(g.get("waiting", 0)),
            kv_usage=g.get("kv_usage", 0.0), raw=Totals(counters[r], hists)))
    return out


@dataclass(frozen=True, slots=True)
class HistoryPoint:
    """One chart point, taken at a sample; rates are over the window ending there."""

    at: float
    healthy: bool
    predicted_hit_rate: float | None
    actual_hit_rate: float | None
    inflight: int
    running: int
    waiting: int
    kv_usage: float
    ttft_p50: float | None
    ttft_p99: float | None
    request_rate: float
    """Requests per second finished since the previous point."""
    output_tokens_per_s: float
    """Output tokens per second since the previous point."""


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    replica_id: str
    window: Totals
    """Counts over the last ``window`` seconds (about: see ``window_s``)."""
    window_s: float
    """The seconds ``window`` really covers (shorter while the gateway is young)."""
    total: Totals
    """Counts since the gateway started."""
    history: tuple[HistoryPoint, ...]

    @property
    def output_tokens_per_s(self) -> float | None:
        return self.window.output_tokens / self.window_s if self.window_s > 0 else None


@dataclass(slots=True)
class _Track:
    totals: Totals = field(default_factory=Totals)
    raw: Totals | None = None
    samples: deque[tuple[float, Totals]] = field(default_factory=deque)
    history: deque[HistoryPoint] = field(default_factory=deque)


class OpsStats:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        window: float = WINDOW_SECONDS,
        interval: float = SAMPLE_INTERVAL_SECONDS,
        history_seconds: float = HISTORY_SECONDS,
    ) -> None:
        if window <= 0 or interval <= 0 or history_seconds < window:
            raise ValueError("need window > 0, interval > 0 and history >= window")
        self.clock = clock
        self.window = window
        self.interval = interval
        self.history_seconds = history_seconds
        self._points = math.ceil(history_seconds / interval) + 1
        self._tracks: dict[str, _Track] = {}

    def sample(self, readings: Iterable[ReplicaReading]) -> None:
        """Fold in the registry's totals and keep a point for the charts."""
        now = self.clock()
        for reading in readings:
            track = self._tracks.setdefault(reading.replica_id, _Track())
            track.totals = _folded(track, reading)
            track.raw = reading.raw
            previous = track.samples[-1] if track.samples else None
            track.samples.append((now, track.totals))
            while len(track.samples) > self._points:
                track.samples.popleft()
            window = track.totals.minus(self._baseline(track, now)[1])
            req_rate = tok_rate = 0.0
            if previous is not None and now > previous[0]:
                step = track.totals.minus(previous[1])
                req_rate = step.requests / (now - previous[0])
                tok_rate = step.output_tokens / (now - previous[0])
            track.history.append(HistoryPoint(
                at=now, healthy=reading.healthy,
                predicted_hit_rate=window.predicted_hit_rate,
                actual_hit_rate=window.actual_hit_rate,
                inflight=reading.inflight, running=reading.running, waiting=reading.waiting,
                kv_usage=reading.kv_usage, ttft_p50=window.quantile("ttft", 0.5),
                ttft_p99=window.quantile("ttft", 0.99), request_rate=req_rate,
                output_tokens_per_s=tok_rate))
            while len(track.history) > self._points:
                track.history.popleft()

    def stats(self, readings: Iterable[ReplicaReading]) -> list[ReplicaStats]:
        """Numbers for each replica as of now; the readings are folded in, not stored."""
        now = self.clock()
        out: list[ReplicaStats] = []
        for reading in readings:
            track = self._tracks.get(reading.replica_id) or _Track()
            current = _folded(track, reading)
            at, baseline = self._baseline(track, now)
            out.append(ReplicaStats(
                replica_id=reading.replica_id, window=current.minus(baseline),
                window_s=now - at, total=current, history=tuple(track.history)))
        return out

    def _baseline(self, track: _Track, now: float) -> tuple[float, Totals]:
        return window_baseline(track.samples, now, self.window)


def window_baseline(samples: Iterable[tuple[float, Totals]], now: float,
                    window: float) -> tuple[float, Totals]:
    """Of timed samples, oldest first: the newest at least ``window`` old, else the oldest
    (``(now, Totals())`` when there are none)."""
    cutoff = now - window
    chosen: tuple[float, Totals] | None = None
    for sample in samples:
        if chosen is not None and sample[0] > cutoff:
            break
        chosen = sample
    return chosen if chosen is not None else (now, Totals())


def _folded(track: _Track, reading: ReplicaReading) -> Totals:
    """The track's totals with what grew since the last sample."""
    if track.raw is None:
        return track.totals  # first sight of the replica: its series are the baseline
    return track.totals.plus_increase(track.raw, reading.raw)


def bucket_quantile(buckets: Buckets, q: float) -> float | None:
    """``histogram_quantile``: linear inside the bucket holding rank ``q``."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank and count > below:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def _combine(buckets: Buckets, other: Buckets,
             op: Callable[[float, float], float]) -> Buckets:
    """``op(count, other's count at the same bound)`` for each bucket of ``buckets``."""
    others = dict(other)
    return tuple((le, op(count, others.get(le, 0.0))) for le, count in buckets)


def _minus(count: float, earlier: float) -> float:
    return count - earlier


def _plus(count: float, mine: float) -> float:
    return count + mine


def _grown(current: float, previous: float) -> float:
    return _increase(previous, current)


def _increase(previous: float, current: float) -> float:
    return current - previous if current >= previous else current


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None
