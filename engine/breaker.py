"""A replica's circuit breaker, and the detector of replicas much slower than their peers.

    closed ──(fail_threshold failures in a row, or one request-path failure,
    │         or "much slower than its peers")──> open
    open ──(cooldown seconds)──> half-open
    half-open ──(the one trial succeeds)──> closed
    half-open ──(the trial fails, or is still slow)──> open (cooldown again)
    any ──(the replica leaves the replica set: drain)──> open for good

A replica is in rotation while its breaker is closed, and in half-open while
its one trial is not taken: the next request (or health probe) routed to it
is the trial. Why it opened matters for what may close it: a replica that was
*failing* closes on a good health probe or a good request; one that was
*slow* answers ``/health`` as fast as ever, so only a request whose time to
first token is no longer slow closes it.

Both classes are pure: the caller hands them the time (``now``), so tests
drive them with a fake clock.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, replace
from enum import Enum


class State(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Reason(str, Enum):
    FAILING = "failing"
    SLOW = "slow"
    DRAINING = "draining"
    """Leaving (replica discovery): requests already sent there may finish."""


COOLDOWN = 5.0
"""Seconds an open breaker waits before its trial (the settings' default)."""


@dataclass(frozen=True, slots=True)
class BreakerSettings:
    fail_threshold: int = 2
    """Failed health probes in a row that open the breaker (a request that cannot
    reach the replica, or gets no first byte in time, opens it at once)."""
    cooldown: float = COOLDOWN
    """Seconds an open breaker waits before letting one trial through (half-open)."""


class CircuitBreaker:
    def __init__(self, settings: BreakerSettings = BreakerSettings(),
                 now: float = 0.0, closed: bool = False) -> None:
        self.settings = settings
        self.state = State.CLOSED if closed else State.OPEN
        self.reason = Reason.FAILING
        self.opened_at = now - settings.cooldown  # a new replica's first probe is its trial
        self.failures = 0
        self.trial_taken = False
        self.opened_count = 0

    # -- reading -------------------------------------------------------------

    def tick(self, now: float) -> State:
        """Advance open -> half-open once the cooldown has passed; the state now."""
        if self.state is State.OPEN and now - self.opened_at >= self.settings.cooldown:
            self.state = State.HALF_OPEN
            self.trial_taken = False
        return self.state

    def admits(self, now: float) -> bool:
        """Whether a request may be routed here now."""
        state = self.tick(now)
        return state is State.CLOSED or (state is State.HALF_OPEN and not self.trial_taken)

    # -- events ----------------------------------------------------------------

    def attempt(self, now: float) -> bool:
        """A request is sent here; True when it is the half-open trial."""
        if self.tick(now) is State.HALF_OPEN and not self.trial_taken:
            self.trial_taken = True
            return True
        return False

    def attempt_ended(self, trial: bool) -> None:
        """A trial that ended with neither verdict (the client left) frees the slot."""
        if trial and self.state is State.HALF_OPEN:
            self.trial_taken = False

    def success(self, now: float, slow: bool = False, from_probe: bool = False) -> None:
        """The replica answered. ``slow``: it answered, but much slower than its peers;
        ``from_probe``: a health probe (which cannot tell a slow replica from a fast one)."""
        self.tick(now)
        self.failures = 0
        if self.state is State.CLOSED:
            if slow:
                self._open(now, Reason.SLOW)
            return
        if self.state is State.OPEN:
            return  # cooling down: nothing closes it early
        if from_probe and self.reason is Reason.SLOW:
            return
        if slow:
            self._open(now, Reason.SLOW)
        else:
            self.state = State.CLOSED
            self.trial_taken = False

    def probe_failed(self, now: float) -> None:
        """A health probe failed: open after ``fail_threshold`` in a row (at once in half-open)."""
        self.failures += 1
        state = self.tick(now)
        if state is State.HALF_OPEN or (state is State.CLOSED
                                        and self.failures >= self.settings.fail_threshold):
            self._open(now, Reason.FAILING)
        elif state is State.OPEN:
            self.reason = Reason.FAILING

    def request_failed(self, now: float) -> None:
        """A request could not reach the replica or got no first byte in time: open now."""
        self.failures = max(self.failures + 1, self.settings.fail_threshold)
        self.tick(now)
        self._open(now, Reason.FAILING)

    def drain(self, now: float) -> None:
        """Open for good (an infinite cool-down never half-opens; an open breaker ignores
        successes), as draining rather than failing: requests already waiting on the
        replica are left to finish (``ReplicaPool.tripped`` is false)."""
        self.settings = replace(self.settings, cooldown=math.inf)
        self._open(now, Reason.DRAINING)

    def _open(self, now: float, reason: Reason) -> None:
        if self.state is not State.OPEN:
            self.opened_count += 1
        self.state = State.OPEN
        self.reason = reason
        self.opened_at = now
        self.trial_taken = False


@dataclass(frozen=True, slots=True)
class SlowSettings:
    enabled: bool = True
    factor: float = 5.0
    """A replica is slow when its median time to first token over the window is
    more than ``factor`` times the median of its peers' medians."""
    window: int = 50
    """Time-to-first-token samples kept per replica."""
    min_samples: int = 20
    """Samples a replica (and at least one peer) needs before it can be judged."""
    min_ttft: float = 0.25
    """Seconds: a median under this is never slow (tiny absolute gaps are noise)."""


class SlowDetector:
    """Per-replica windows of time to first token, compared with the fleet's."""

    def __init__(self, settings: SlowSettings = SlowSettings()) -> None:
        self.settings = settings
        self._samples: dict[str, deque[float]] = {}

    def record(self, replica_id: str, ttft: float) -> None:
        window = self._samples.get(replica_id)
        if window is None:
            window = self._samples[replica_id] = deque(maxlen=max(1, self.settings.window))
        window.append(ttft)

    def forget(self, replica_id: str) -> None:
        """Start the replica's window afresh (it left rotation, or left the fleet)."""
        self._samples.pop(replica_id, None)

    def median(self, replica_id: str) -> float | None:
        window = self._samples.get(replica_id)
        if not window or len(window) < self.settings.min_samples:
            return None
        return statistics.median(window)

    def is_slow(self, replica_id: str, peers: list[str]) -> bool:
        """Whether ``replica_id`` is much slower than the median of ``peers`` (others in rotation)."""
        if not self.settings.enabled:
            return False
        mine = self.median(replica_id)
        if mine is None or mine < self.settings.min_ttft:
            return False
        others = [m for m in (self.median(p) for p in peers if p != replica_id) if m is not None]
        if not others:
            return False
        return mine > self.settings.factor * statistics.median(others)

    def trial_is_slow(self, ttft: float, peers: list[str]) -> bool:
        """Whether one half-open trial's time to first token is still slow."""
        others = [m for m in (self.median(p) for p in peers) if m is not None]
        if not self.settings.enabled or not others or ttft < self.settings.min_ttft:
            return False
        return ttft > self.settings.factor * statistics.median(others)
