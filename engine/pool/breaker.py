"""A replica's circuit breaker: in rotation, out, or on trial.

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

The breaker is pure: the caller hands it the time (``now``), so tests drive
it with a fake clock. What counts as "much slower" is :mod:`engine.pool.slow`'s.
"""

from __future__ import annotations

import math
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
