"""Notice when a group's stable prefix suddenly shortens, and say what changed.

For every request of a group (one app: model, tenant, template shape), the
tracker measures how much of the stable prefix text (system prompt and tool
strings) repeats the previous request's: ``share = common prefix / length``.
That share is what the engine's prefix cache can reuse, so it moves with the
group's hit rate.

A drift is declared when the mean share of the last ``recent`` requests falls
by at least ``drop`` (absolute) and to at most ``ratio`` of the mean share of
the ``baseline`` requests before them, from a baseline of at least
``min_share`` — "95% to 30%". A one-off change (a new deploy of the prompt
that is again stable) moves one request, not the mean, and is not a drift.

The event names where requests now start to differ and shows the text there
before (from the last request of the good regime) and after (from the two
latest requests, which differ from each other). The new regime becomes the
baseline once it has filled the windows again, so one change is reported
once. Memory per group: two texts and two short windows of numbers.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from math import fsum
from statistics import median

from gateway.lint.textdiff import common_prefix, common_suffix

EXCERPT = 160


@dataclass(frozen=True, slots=True)
class DriftSettings:
    baseline: int = 12
    recent: int = 6
    drop: float = 0.3
    ratio: float = 0.6
    min_share: float = 0.5


@dataclass(frozen=True, slots=True)
class Drift:
    """What the tracker saw; the service turns it into a ``DriftEvent``."""

    offset: int
    stable_before: int
    stable_after: int
    share_before: float
    share_after: float
    old_text: str
    new_text: str
    new_text_other: str
    lost_text: str
    """The old prefix text that is no longer shared (to count lost tokens)."""


class DriftTracker:
    def __init__(self, settings: DriftSettings = DriftSettings()) -> None:
        self.settings = settings
        self.previous: str | None = None
        self.good_example: str | None = None
        self.baseline: deque[tuple[float, int]] = deque(maxlen=settings.baseline)
        self.recent: deque[tuple[float, int]] = deque(maxlen=settings.recent)

    def observe(self, text: str) -> Drift | None:
        previous, self.previous = self.previous, text
        if previous is None:
            self.good_example = text
            return None
        shared = len(text) if previous == text else common_prefix(previous, text)
        share = shared / len(text) if text else 1.0
        if len(self.recent) == self.recent.maxlen:
            self.baseline.append(self.recent[0])
        self.recent.append((share, shared))
        if len(self.baseline) < self.settings.recent:
            if share >= self.settings.min_share:
                self.good_example = text
            return None
        before = _mean([s for s, _ in self.baseline])
        after = _mean([s for s, _ in self.recent])
        if after >= before - self.settings.drop * 0.5 and share >= before - 0.1:
            self.good_example = text  # still in the good regime
        if (before >= self.settings.min_share and after <= before - self.settings.drop
                and after <= before * self.settings.ratio
                and len(self.recent) == self.recent.maxlen):
            drift = self._describe(previous, text, before, after)
            # Start over in the new regime: it becomes the baseline once it has filled up.
            self.baseline.clear()
            self.recent.clear()
            self.good_example = text
            return drift
        return None

    def _describe(self, previous: str, current: str, before: float, after: float) -> Drift:
        # Measure the new regime from where it started inside the recent window.
        recent = list(self.recent)
        start = next((i for i, (share, _) in enumerate(recent)
                      if share <= before - self.settings.drop), 0)
        changed = recent[start:] or recent
        after = _mean([share for share, _ in changed])
        old = self.good_example or previous
        head = common_prefix(old, current)
        tail = common_suffix(old, current, head)
        other_head = common_prefix(old, previous)
        other_tail = common_suffix(old, previous, other_head)
        stable_before = int(median(n for _, n in self.baseline))
        stable_after = int(median(n for _, n in changed))
        return Drift(
            offset=head,
            stable_before=stable_before,
            stable_after=stable_after,
            share_before=before,
            share_after=after,
            old_text=_excerpt(old, head, len(old) - tail),
            new_text=_excerpt(current, head, len(current) - tail),
            new_text_other=_excerpt(previous, other_head, len(previous) - other_tail),
            lost_text=old[stable_after:stable_before])


def _excerpt(text: str, start: int, end: int) -> str:
    """The changed span, widened where it cuts a word, cut to ``EXCERPT`` characters."""
    if end <= start:
        return ""
    while 0 < start < len(text) and text[start - 1].isalnum() and text[start].isalnum():
        start -= 1
    while 0 < end < len(text) and text[end - 1].isalnum() and text[end].isalnum():
        end += 1
    piece = text[start:end].strip()
    return piece if len(piece) <= EXCERPT else piece[:EXCERPT - 1] + "…"


def _mean(values: list[float]) -> float:
    """The mean of a window's shares, correctly rounded sum (``statistics.mean`` is exact
    too, by fractions: 60 us a call, a quarter of a live request's lint)."""
    return fsum(values) / len(values)
