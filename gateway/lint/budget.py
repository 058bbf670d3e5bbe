"""The live linter's share of a core (``lint.cpu_share``).

What the linter costs depends on the prompts, not on the gateway: a warm system
prompt is a hash, a new one is the detector over all of it (0.3 ms a request
with warm prompts, 2.6 ms for a new 12,000-character system prompt of random
words, 11 ms for one of this project's docs: docs/benchmarks/overhead.md). Traffic
of new long prefixes (documents in the system prompt) would have the linter take
more of the machine than the routing. The budget bounds it: CPU seconds accrue at
``share`` a second of wall time, up to ``burst``; a request is linted only while
the balance is positive and is charged the CPU time the lint took (its thread's);
the others are skipped and counted (``prefixgate_lint_dropped_total``), so what is
linted stays a sample of the traffic as it is now. The linter learns from fewer
requests then, never from a stale queue.
"""

from __future__ import annotations

import time
from collections.abc import Callable

BURST_SECONDS = 2.5
"""After a quiet spell the linter may spend this many seconds' worth of its share at
once (0.25 s of CPU at a share of 0.1)."""


class CpuBudget:
    def __init__(self, share: float, burst: float | None = None,
                 wall: Callable[[], float] = time.monotonic) -> None:
        """``share``: of one core (0: no limit). ``burst``: CPU seconds that may be spent
        at once after a quiet spell (``share * BURST_SECONDS`` unless given)."""
        self.share = share
        self.burst = share * BURST_SECONDS if burst is None else burst
        self.wall = wall
        self.balance = self.burst
        self._at = wall()

    def allows(self) -> bool:
        """Whether the next request may be linted."""
        if self.share <= 0:
            return True
        now = self.wall()
        self.balance = min(self.burst, self.balance + (now - self._at) * self.share)
        self._at = now
        return self.balance > 0

    def charge(self, cpu_seconds: float) -> None:
        """A lint's CPU time, at most half a burst: the budget paces many requests, and
        one slow lint (the first ones warm the detector and the model's template up:
        hundreds of milliseconds) does not stop the linter for seconds after it."""
        if self.share > 0:
            self.balance -= min(cpu_seconds, self.burst / 2)
