"""Work in flight on a replica: its queued prefill, and how fast it gets through it.

The gateway knows, for every request it sends, how many prompt tokens the
replica must still prefill for it (the prompt less what routing expected the
replica to hold). Until the replica confirms that prefill (a stream's first
token), those tokens are work a new request queues behind. Two pieces model
it, both pure (the caller hands in the time):

:class:`PrefillQueue` is one replica's queue of unconfirmed prefill, as a
virtual FIFO: ``add`` puts a request's tokens at the back and returns the
work ahead of it; the queue drains at the replica's prefill speed
(``seconds_per_token``) from the moment it has work, front first;
``settle`` takes a request's tokens out when it is confirmed or gone (of
the drain so far, as much as those tokens were worth is spent on them, as
if they had been first). ``tokens(now)`` is what is left: the pending
prefill a policy prices (``ReplicaView.pending_prefill_tokens``). A
confirmation is exact; the drain is the estimate in between, and it is what
stops a non-streaming request's prefill from counting until its whole
answer is back.

:class:`WorkSamples` is one replica's recent (work, time to first token)
pairs, where work is the prefill queued ahead at send plus the request's
own uncached tokens, and their least-squares line ``ttft = a + b * work``
(:class:`WorkLine`). ``b`` is the replica's measured prefill speed, which
the queue drains at; the line also says what a replica *should* take for a
given amount of work, which is how the slow-replica detector tells load from
a fault (:mod:`engine.slow`). Sums are kept as samples come and go, so a fit
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

    def add(self, work: float, ttft: float) -> None:
        if len(self._samples) == self._window:
            old_work, old_ttft = self._samples.popleft()
            self.sums.add(old_work, old_ttft, -1)
        self._samples.append((work, ttft))
        self.sums.add(work, ttft, 1)

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
    """One replica's unconfirmed prefill, draining front first at ``seconds_per_token``."""

    __slots__ = ("_drained", "_queued", "_stamp", "requests")

    def __init__(self) -> None:
        self._queued = 0.0
        """Tokens of the unconfirmed requests."""
        self._drained = 0.0
        """Of those, how many the replica is estimated to have prefilled, as of ``_stamp``."""
        self._stamp = 0.0
        self.requests = 0
        """Requests whose prefill is not settled."""

    def tokens(self, now: float, seconds_per_token: float) -> int:
        """Prefill left in the queue at ``now``."""
        if self._queued <= 0:
            return 0
        drained = self._drained + max(0.0, now - self._stamp) / seconds_per_token
        return int(max(0.0, self._queued - drained))

    def add(self, tokens: int, now: float, seconds_per_token: float) -> int:
        """A request with ``tokens`` to prefill joins the back; returns the work ahead of it."""
        ahead = self.tokens(now, seconds_per_token)
        self._advance(now, seconds_per_token)
        self._queued += tokens
        self.requests += 1
        return ahead

    def settle(self, tokens: int, now: float, seconds_per_token: float) -> None:
        """A request's prefill was confirmed, or it left unconfirmed: its tokens go."""
        self._advance(now, seconds_per_token)
        spent = min(self._drained, float(tokens))
        self._drained -= spent
        self._queued = max(0.0, self._queued - tokens)
        self._drained = min(self._drained, self._queued)
        self.requests = max(0, self.requests - 1)

    def _advance(self, now: float, seconds_per_token: float) -> None:
        if self._queued > 0:
            self._drained = min(self._queued, self._drained
                                + max(0.0, now - self._stamp) / seconds_per_token)
        else:
            self._drained = 0.0
        self._stamp = now
