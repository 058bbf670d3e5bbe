"""Rolling per-replica numbers for the ops view (``/admin/replicas``, ``/dashboard``).

Two feeds, both cheap and synchronous:

* ``record(...)`` — once per finished request, from ``GatewayState.record``:
  the prompt tokens routed to the replica, how many of them the policy
  expected to be cached there (the *predicted* hits), the time to first token
  (streams only: a buffered answer has no first token to time) and whether
  the replica answered 200.
* ``sample(readings)`` — every ``interval`` seconds, from the pool (see
  :mod:`gateway.ops_sampler`): the replica's own prefix-cache counters
  (``vllm:prefix_cache_hits_total`` / ``queries_total``, in tokens: the
  *actual* hits) and its load gauges.

Every figure is a difference of cumulative totals. Each sample stores the
totals of every replica at that moment; "over the last minute" is *now*
minus the newest sample at least ``window`` seconds old (or the oldest one,
while the gateway is younger than the window); "since start" counts from the
gateway's start (the replica's counters as first sampled are the baseline,
so traffic it served before is left out). The replica's counters fall back
to zero when it restarts: such a drop is taken as a reset (the new value is
all increase), the way Prometheus' ``rate`` does, so the totals only grow.

Hit rate = hit tokens / looked-up tokens: predicted = predicted cached /
prompt tokens routed; actual = the replica's hits / queries. ``None`` when
nothing was looked up in the window. TTFT p50 / p99 use nearest rank over the
streams that finished in the window, at most ``max_ttft_samples`` per replica
(at higher rates, over the newest ones).

Memory is bounded: ``history_seconds / interval`` samples and history points
per replica, and the TTFT ring. Time comes from the injected ``clock``.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

WINDOW_SECONDS = 60.0
SAMPLE_INTERVAL_SECONDS = 2.0
HISTORY_SECONDS = 600.0
MAX_TTFT_SAMPLES = 4096


@dataclass(frozen=True, slots=True)
class ReplicaReading:
    """What the pool says about one replica right now."""

    replica_id: str
    healthy: bool
    inflight: int
    running: int
    waiting: int
    kv_usage: float
    prefix_hits: float
    """The replica's own cumulative prefix-cache hit tokens."""
    prefix_queries: float
    """The replica's own cumulative prefix-cache looked-up tokens."""


@dataclass(frozen=True, slots=True)
class Totals:
    """Cumulative counts of one replica since the gateway started."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    predicted_cached_tokens: int = 0
    cache_queries: float = 0.0
    cache_hits: float = 0.0

    def minus(self, earlier: Totals) -> Totals:
        return Totals(
            requests=self.requests - earlier.requests,
            errors=self.errors - earlier.errors,
            prompt_tokens=self.prompt_tokens - earlier.prompt_tokens,
            predicted_cached_tokens=self.predicted_cached_tokens - earlier.predicted_cached_tokens,
            cache_queries=self.cache_queries - earlier.cache_queries,
            cache_hits=self.cache_hits - earlier.cache_hits,
        )

    @property
    def predicted_hit_rate(self) -> float | None:
        return _ratio(self.predicted_cached_tokens, self.prompt_tokens)

    @property
    def actual_hit_rate(self) -> float | None:
        return _ratio(self.cache_hits, self.cache_queries)


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


@dataclass(frozen=True, slots=True)
class ReplicaStats:
    replica_id: str
    window: Totals
    """Counts over the last ``window`` seconds."""
    total: Totals
    """Counts since the gateway started."""
    ttft_p50: float | None
    ttft_p99: float | None
    ttft_samples: int
    history: tuple[HistoryPoint, ...]


@dataclass(slots=True)
class _Track:
    totals: Totals = field(default_factory=Totals)
    raw_hits: float | None = None
    raw_queries: float | None = None
    samples: deque[tuple[float, Totals]] = field(default_factory=deque)
    ttfts: deque[tuple[float, float]] = field(default_factory=deque)
    history: deque[HistoryPoint] = field(default_factory=deque)


class OpsStats:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        window: float = WINDOW_SECONDS,
        interval: float = SAMPLE_INTERVAL_SECONDS,
        history_seconds: float = HISTORY_SECONDS,
        max_ttft_samples: int = MAX_TTFT_SAMPLES,
    ) -> None:
        if window <= 0 or interval <= 0 or history_seconds < window:
            raise ValueError("need window > 0, interval > 0 and history >= window")
        self.clock = clock
        self.window = window
        self.interval = interval
        self.history_seconds = history_seconds
        self._points = math.ceil(history_seconds / interval) + 1
        self._max_ttfts = max_ttft_samples
        self._tracks: dict[str, _Track] = {}

    # -- feeds -------------------------------------------------------------

    def record(self, replica_id: str, prompt_tokens: int, predicted_cached_tokens: int,
               ttft: float | None, ok: bool) -> None:
        """One finished request that a replica answered (with any status)."""
        track = self._track(replica_id)
        t = track.totals
        if not ok:
            track.totals = replace(t, requests=t.requests + 1, errors=t.errors + 1)
            return
        track.totals = replace(
            t, requests=t.requests + 1, prompt_tokens=t.prompt_tokens + prompt_tokens,
            predicted_cached_tokens=t.predicted_cached_tokens + predicted_cached_tokens)
        if ttft is not None:
            track.ttfts.append((self.clock(), ttft))
            if len(track.ttfts) > self._max_ttfts:
                track.ttfts.popleft()

    def sample(self, readings: Iterable[ReplicaReading]) -> None:
        """Fold in the replicas' own counters and keep a point for the charts."""
        now = self.clock()
        for reading in readings:
            track = self._track(reading.replica_id)
            track.totals = _folded(track, reading)
            track.raw_hits, track.raw_queries = reading.prefix_hits, reading.prefix_queries
            previous = track.samples[-1] if track.samples else None
            track.samples.append((now, track.totals))
            while len(track.samples) > self._points:
                track.samples.popleft()
            window = track.totals.minus(self._baseline(track, now))
            p50, p99, _ = self._ttft(track, now)
            rate = 0.0
            if previous is not None and now > previous[0]:
                rate = (track.totals.requests - previous[1].requests) / (now - previous[0])
            track.history.append(HistoryPoint(
                at=now, healthy=reading.healthy,
                predicted_hit_rate=window.predicted_hit_rate,
                actual_hit_rate=window.actual_hit_rate,
                inflight=reading.inflight, running=reading.running, waiting=reading.waiting,
                kv_usage=reading.kv_usage, ttft_p50=p50, ttft_p99=p99, request_rate=rate))
            while len(track.history) > self._points:
                track.history.popleft()

    # -- answers -------------------------------------------------------------

    def stats(self, readings: Iterable[ReplicaReading]) -> list[ReplicaStats]:
        """Numbers for each replica as of now; the readings are folded in, not stored."""
        now = self.clock()
        out: list[ReplicaStats] = []
        for reading in readings:
            track = self._track(reading.replica_id)
            current = _folded(track, reading)
            p50, p99, count = self._ttft(track, now)
            out.append(ReplicaStats(
                replica_id=reading.replica_id,
                window=current.minus(self._baseline(track, now)),
                total=current,
                ttft_p50=p50, ttft_p99=p99, ttft_samples=count,
                history=tuple(track.history)))
        return out

    # -- internals -------------------------------------------------------------

    def _track(self, replica_id: str) -> _Track:
        track = self._tracks.get(replica_id)
        if track is None:
            track = self._tracks[replica_id] = _Track()
        return track

    def _baseline(self, track: _Track, now: float) -> Totals:
        """Totals at the newest sample at least ``window`` old, else the oldest."""
        if not track.samples:
            return Totals()
        cutoff = now - self.window
        chosen = track.samples[0][1]
        for at, totals in track.samples:
            if at > cutoff:
                break
            chosen = totals
        return chosen

    def _ttft(self, track: _Track, now: float) -> tuple[float | None, float | None, int]:
        cutoff = now - self.window
        while track.ttfts and track.ttfts[0][0] < cutoff:
            track.ttfts.popleft()
        values = sorted(ttft for _, ttft in track.ttfts)
        return _nearest_rank(values, 0.50), _nearest_rank(values, 0.99), len(values)


def _folded(track: _Track, reading: ReplicaReading) -> Totals:
    """The track's totals with the replica's counter increase since the last sample."""
    if track.raw_hits is None or track.raw_queries is None:
        return track.totals  # first sight of the replica: its counters are the baseline
    return replace(
        track.totals,
        cache_hits=track.totals.cache_hits + _increase(track.raw_hits, reading.prefix_hits),
        cache_queries=track.totals.cache_queries
        + _increase(track.raw_queries, reading.prefix_queries),
    )


def _increase(previous: float, current: float) -> float:
    return current - previous if current >= previous else current


def _ratio(part: float, whole: float) -> float | None:
    return part / whole if whole > 0 else None


def _nearest_rank(sorted_values: list[float], quantile: float) -> float | None:
    if not sorted_values:
        return None
    rank = max(1, math.ceil(quantile * len(sorted_values)))
    return sorted_values[rank - 1]
