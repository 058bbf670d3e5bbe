"""The outcome of one contender in a benchmark: figures, or why there are none."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from loadtest.measure import MeasuredRun
from loadtest.summary import RunSummary, summarize


@dataclass(frozen=True)
class ContenderResult:
    name: str
    """Row label, e.g. ``prefixgate:prefix``, ``vllm-router:cache_aware``, ``direct:sim0``."""
    run: MeasuredRun | None = None
    unavailable: str | None = None
    """Why there is no run (install or start-up failure, with the log excerpt)."""
    note: str = ""

    def __post_init__(self) -> None:
        if (self.run is None) == (self.unavailable is None):
            raise ValueError("a contender result has either a run or an unavailable reason")

    @cached_property
    def summary(self) -> RunSummary | None:
        return summarize(self.run) if self.run is not None else None

    @classmethod
    def failed(cls, name: str, reason: str, note: str = "") -> ContenderResult:
        return cls(name=name, unavailable=reason, note=note)
