"""Work in flight on a replica: its queued prefill, and how fast it gets through it.

The gateway knows, for every request it sends, how many prompt tokens the
replica must still prefill for it (the prompt less what routing expected the
replica to hold). Until the replica confirms that prefill (a stream's first
token), those tokens are work a new request queues behind. Two pieces model
it, both pure (the caller hands in the time):

:class:`PrefillQueue` is one replica's queue of unconfirmed prefill, as a
FIFO: ``add`` puts a request's tokens at the back and returns the work
ahead of it; between two pieces of news the queue is assumed to drain front
first at ``seconds_per_token`` (the pool's assumed prefill speed); a
request's first token is news (``settle(confirmed=True)``): the engine
schedules prefill first come first served, so everything sent before it is
prefilled too, and the drain catches up with that point if it lagged; a
request that ends without one (failed, aborted, or a non-streaming answer
whose first byte is its last) leaves its place. ``tokens(now)`` is what is
left: the pending prefill a policy prices (``ReplicaView.pending_prefill_tokens``).
The assumed speed only matters between confirmations, and it is what stops
a non-streaming request's prefill from counting until its whole answer is
back. (The speed is not fitted from times to first token: on a busy
gateway those measure its own event loop as much as the replica, and a
fitted speed two to five times off in either direction made bursts
spread too little or too much.)

:class:`WorkSamples` is one replica's recent (work, time to first token)
pairs, where work is the prefill queued ahead at send plus the request's
own uncached tokens, and their least-squares line ``ttft = a + b * work``
(:class:`WorkLine`): what a replica *should* take for a given amount of
work, which is how the slow-replica detector tells load from a fault
(:mod:`engine.pool.slow`); its slope is shown on the ops view as the replica's
measured prefill speed. Sums are kept as samples come and go, so a fit
costs O(1) and pooling several replicas' samples O(replicas).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

MIN_SPREAD_TOKENS = 64.0
"""Standard deviation of the work below which a line's slope is not trusted."""


@dataclass(frozen=True, slots=True)
class WorkLine:
    """``ttft = intercept + slope * work``; both non-negative."""

    intercept: float
    slope: float | None
    """Seconds per token of work; None when the samples cannot tell (too alike)."""

    def expected(self, work: float) -> float:
        return self.intercept + (self.slope or 0.0) * work


@dataclass(slots=True)
class _Sums:
    n: int = 0
    w: float = 0.0
    t: float = 0.0
    ww: float = 0.0
    wt: float = 0.0

    def add(self, work: float, ttft: float, sign: int) -> None:
        self.n += sign
        self.w += sign * work
        self.t += sign * ttft
        self.ww += sign * work * work
        self.wt += sign * work * ttft

    def plus(self, other: _Sums) -> _Sums:
        return _Sums(self.n + other.n, self.w + other.w, self.t + other.t,
                     self.ww + other.ww, self.wt + other.wt)


def fit(sums: _Sums) -> WorkLine | None:
    """The least-squares line through the samples, kept non-negative (None: no samples)."""
    if sums.n <= 0:
        return None
    mean_w, mean_t = sums.w / sums.n, sums.t / sums.n
    variance = sums.ww / sums.n - mean_w * mean_w
    if variance < MIN_SPREAD_TOKENS * MIN_SPREAD_TOKENS:
        return WorkLine(max(0.0, mean_t), None)
    slope = (sums.wt / sums.n - mean_w * mean_t) / variance
    intercept = mean_t - slope * mean_w
    if slope <= 0:
        return WorkLine(max(0.0, mean_t), 0.0)
    if intercept < 0:  # through the origin instead
        return WorkLine(0.0, sums.wt / sums.ww if sums.ww > 0 else slope)
    return WorkLine(intercept, slope)


class WorkSamples:
    """The last ``window`` (work, ttft) samples of one replica, with their sums."""

    def __init__(self, window: int) -> None:
        self._samples: deque[tuple[float, float]] = deque()
        self._window = max(1, window)
        self.sums = _Sums()

    def add(self, work: float, ttft: float) -> tuple[float, float] | None:
        """Keep the sample; returns the one it pushed out of the window, if any."""
        old = None
        if len(self._samples) == self._window:
            old = self._samples.popleft()
            self.sums.add(old[0], old[1], -1)
        self._samples.append((work, ttft))
        self.sums.add(work, ttft, 1)
        return old

    def __len__(self) -> int:
        return len(self._samples)

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return iter(self._samples)

    def line(self) -> WorkLine | None:
        return fit(self.sums)


def pooled_line(samples: list[WorkSamples]) -> WorkLine | None:
    """One line through several replicas' samples together."""
    total = _Sums()
    for each in samples:
        total = total.plus(each.sums)
    return fit(total)


class PrefillQueue:
    """One replica's unconfirmed prefill: a FIFO of requests, drained front first."""

    __slots__ = ("_drained", "_entries", "_next", "_queued", "_stamp")

    def __init__(self) -> None:
        self._entries: dict[int, int] = {}
        """Unsettled requests in the order they were sent: ticket -> prompt tokens."""
        self._next = 0
        self._queued = 0
        """Tokens of the unsettled requests."""
        self._drained = 0.0
        """Of those, how many the replica is estimated to have prefilled, as of ``_stamp``."""
        self._stamp = 0.0

    @property
    def requests(self) -> int:
        """Requests whose prefill is not settled."""
        return len(self._entries)

    def _drained_at(self, now: float, seconds_per_token: float) -> float:
        return min(float(self._queued),
                   self._drained + max(0.0, now - self._stamp) / seconds_per_token)

    def tokens(self, now: float, seconds_per_token: float) -> int:
        """Prefill left in the queue at ``now``."""
        if not self._queued:
            return 0
        return int(self._queued - self._drained_at(now, seconds_per_token))

    def progress(self, now: float, seconds_per_token: float) -> tuple[int, int]:
        """Prefill left in the queue at ``now``, and how many requests at its front the
        drain has covered whole: prefilled by the estimate, only not confirmed yet."""
        if not self._queued:
            return 0, 0
        drained = self._drained_at(now, seconds_per_token)
        left = int(self._queued - drained)
        covered = 0
        for count in self._entries.values():
            if count > drained:
                break
            drained -= count
            covered += 1
        return left, covered

    def add(self, tokens: int, now: float, seconds_per_token: float) -> tuple[int, int]:
        """A request with ``tokens`` to prefill joins the back: its ticket, and the work
        ahead of it."""
        ahead = self.tokens(now, seconds_per_token)
        self._advance(now, seconds_per_token)
        ticket = self._next
        self._next += 1
        self._entries[ticket] = tokens
        self._queued += tokens
        return ticket, ahead

    def settle(self, ticket: int, now: float, seconds_per_token: float,
               confirmed: bool) -> None:
        """The request's prefill is over: ``confirmed`` (its first token came, so the
        replica is at least this far along the FIFO), or it left without one."""
        tokens = self._entries.get(ticket)
        if tokens is None:
            return
        self._advance(now, seconds_per_token)
        ahead = 0
        for earlier, count in self._entries.items():
            if earlier == ticket:
                break
            ahead += count
        if confirmed:
            self._drained = max(self._drained, float(ahead + tokens))
        # of the drain so far, what fell on this request's place in the FIFO goes with it
        self._drained -= min(max(0.0, self._drained - ahead), float(tokens))
        del self._entries[ticket]
        self._queued -= tokens
        self._drained = min(self._drained, float(self._queued))

    def _advance(self, now: float, seconds_per_token: float) -> None:
        if self._queued:
            self._drained = self._drained_at(now, seconds_per_token)
        else:
            self._drained = 0.0
        self._stamp = now
