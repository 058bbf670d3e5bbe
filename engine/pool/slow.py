"""Which replica is much slower than its peers *for the work it was given*.

Under cache-aware routing, latency relative to peers is not a health signal:
a replica that misses is expected to be slower than one that hits, and a
replica that a burst landed on is slower while it works through the queue.
Ejecting it for that sends the next burst to the others, which then look
slow in turn. So a replica is judged by what it does with the work it has.

Each time to first token comes with its *work*: the prefill queued ahead of
the request on that replica when it was sent, plus the request's own
uncached prompt tokens (:mod:`engine.pool.prefill`). Every replica keeps its last
``window`` (work, ttft) samples. To judge replica ``r``, the samples of its
peers in rotation, pooled, give the line ``ttft = a + b * work``: what a
healthy replica of this fleet takes for a given amount of work (when the
peers' work was all alike, so that their line has no slope, the line goes
through every replica's samples, ``r``'s included, if that one has a slope;
with no spread of work anywhere it is the peers' mean time). ``r`` is
slow when the median over its own samples of ``ttft / (a + b * work)`` is
more than ``factor``, and its own median ttft is at least ``min_ttft``. A
healthy replica under a burst has large work and a large ttft: ratio about
1. A replica whose engine got ten times slower per token has ratio about 10
whatever its load, and leaves rotation as soon as it has ``min_samples``
samples, as before. (Hung and stopped replicas are caught sooner, by
timeouts and failed probes: :mod:`engine.pool.replicas`.)

Each replica's own line gives its prefill speed (``seconds_per_token``), at
which the pool drains its queue of unconfirmed prefill.

Settings (``breaker.slow``):

* ``enabled`` (default true).
* ``factor`` (default 5.0): how many times the work-normalised time of its
  peers a replica may take.
* ``window`` (default 50): samples kept per replica.
* ``min_samples`` (default 20): samples the replica, and its peers together,
  need before it is judged.
* ``min_ttft`` (default 0.25 s): a replica whose median time to first token
  is under this is never slow (tiny absolute gaps are noise).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from engine.pool.prefill import WorkLine, WorkSamples, pooled_line

FLOOR_SECONDS = 0.001
"""Least expected time a sample is compared with (a line through zero)."""


@dataclass(frozen=True, slots=True)
class SlowSettings:
    enabled: bool = True
    factor: float = 5.0
    """A replica is slow when its median ratio of time to first token to what its
    peers take for the same work is more than this."""
    window: int = 50
    """(work, time to first token) samples kept per replica."""
    min_samples: int = 20
    """Samples a replica (and its peers together) need before it can be judged."""
    min_ttft: float = 0.25
    """Seconds: a median under this is never slow (tiny absolute gaps are noise)."""


class SlowDetector:
    """Per-replica windows of (work, time to first token), judged against the peers'."""

    def __init__(self, settings: SlowSettings = SlowSettings()) -> None:
        self.settings = settings
        self._samples: dict[str, WorkSamples] = {}
        self._at_least_min: dict[str, int] = {}
        """Per replica, the samples of its window at or above ``min_ttft``: with none,
        its median is under it, and ``is_slow`` answers without a median (it is asked
        at every first byte)."""

    def record(self, replica_id: str, ttft: float, work: float) -> None:
        window = self._samples.get(replica_id)
        if window is None:
            window = self._samples[replica_id] = WorkSamples(self.settings.window)
        floor = self.settings.min_ttft
        dropped = window.add(work, ttft)
        change = (ttft >= floor) - (dropped is not None and dropped[1] >= floor)
        if change:
            self._at_least_min[replica_id] = self._at_least_min.get(replica_id, 0) + change

    def forget(self, replica_id: str) -> None:
        """Start the replica's window afresh (it left rotation, or left the fleet)."""
        self._samples.pop(replica_id, None)
        self._at_least_min.pop(replica_id, None)

    def seconds_per_token(self, replica_id: str) -> float | None:
        """The replica's measured prefill speed: its own line's slope, else the fleet's."""
        own = self._samples.get(replica_id)
        line = own.line() if own is not None else None
        if line is not None and line.slope:
            return line.slope
        fleet = pooled_line(list(self._samples.values()))
        return fleet.slope if fleet is not None and fleet.slope else None

    def _peer_line(self, replica_id: str, peers: list[str]) -> WorkLine | None:
        windows = [self._samples[p] for p in peers if p != replica_id and p in self._samples]
        if sum(len(w) for w in windows) < self.settings.min_samples:
            return None
        line = pooled_line(windows)
        if line is not None and line.slope is None and replica_id in self._samples:
            # The peers' work was all alike (say, all cache hits): their line cannot
            # say what more work costs. With the replica's own samples the fleet's
            # line can; a replica slow at every amount of work still stands out.
            fleet = pooled_line([*windows, self._samples[replica_id]])
            if fleet is not None and fleet.slope is not None:
                return fleet
        return line

    def ratio(self, replica_id: str, peers: list[str]) -> float | None:
        """Median of the replica's ttft over what its peers take for the same work."""
        mine = self._samples.get(replica_id)
        line = self._peer_line(replica_id, peers)
        if mine is None or len(mine) < self.settings.min_samples or line is None:
            return None
        return statistics.median(
            ttft / max(line.expected(work), FLOOR_SECONDS) for work, ttft in mine)

    def is_slow(self, replica_id: str, peers: list[str]) -> bool:
        """Whether ``replica_id`` is much slower than ``peers`` (others in rotation)."""
        if not self.settings.enabled:
            return False
        mine = self._samples.get(replica_id)
        if mine is None or not self._at_least_min.get(replica_id) \
                or statistics.median(t for _, t in mine) < self.settings.min_ttft:
            return False
        ratio = self.ratio(replica_id, peers)
        return ratio is not None and ratio > self.settings.factor

    def trial_is_slow(self, ttft: float, work: float, peers: list[str]) -> bool:
        """Whether one half-open trial's time to first token is still slow."""
        if not self.settings.enabled or ttft < self.settings.min_ttft:
            return False
        line = self._peer_line("", peers)
        return line is not None and ttft > self.settings.factor * max(line.expected(work),
                                                                      FLOOR_SECONDS)
