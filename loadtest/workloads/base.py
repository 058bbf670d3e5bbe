"""The value every workload produces: conversations with arrival times.

A workload is a seeded, deterministic list of :class:`Conversation` values
plus how to pace them (:class:`Pacing`). A conversation has an optional
system prompt and one or more user turns; the load generator sends turn
``k`` with the whole history so far (system, every earlier user turn and the
*real* answer the server gave to it) and issues turn ``k + 1`` only after
the answer to turn ``k`` arrived. Single-shot workloads (shared-prefix,
mooncake) are conversations of one turn.

Pacing:

* ``closed``: ``concurrency`` workers each take the next conversation as
  soon as their previous one is done; ``arrival`` is ignored;
* ``poisson`` (Poisson arrivals at ``rate`` per second, drawn by
  :func:`paced`) and ``trace`` (arrival times taken from a trace): open
  loop, conversation ``i`` starts at its ``arrival`` second after the run
  began whatever the server is doing; ``concurrency`` then caps requests in
  flight (arrivals beyond it wait for a slot; 0 means no cap).

``system_clock``: the load generator prepends the current wall-clock time (to
the millisecond) to the system prompt at the moment the request is sent —
the classic "Today is ..." line that defeats prefix caching. It is a flag
and not text so that the workload itself stays deterministic.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Literal

PacingMode = Literal["closed", "poisson", "trace"]


@dataclass(frozen=True, slots=True)
class Turn:
    user: str
    max_tokens: int


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    group: str
    """What the conversation shares a prefix with: app, user or trace session."""
    turns: tuple[Turn, ...]
    system: str | None = None
    arrival: float = 0.0
    """Seconds after the start of the run (open loop only)."""
    system_clock: bool = False


@dataclass(frozen=True, slots=True)
class Pacing:
    mode: PacingMode = "closed"
    concurrency: int = 16
    """Closed loop: conversations in progress at once. Open loop: cap on
    requests in flight (0: no cap)."""
    rate: float | None = None
    """Poisson arrivals per second (``poisson`` only)."""

    def __post_init__(self) -> None:
        if self.mode == "poisson" and not (self.rate and self.rate > 0):
            raise ValueError("poisson pacing needs a positive rate")
        if self.mode == "closed" and self.concurrency <= 0:
            raise ValueError("closed-loop pacing needs a positive concurrency")
        if self.concurrency < 0:
            raise ValueError("concurrency must not be negative")

    @property
    def open_loop(self) -> bool:
        return self.mode != "closed"

    def describe(self) -> str:
        if self.mode == "closed":
            return f"closed loop, concurrency {self.concurrency}"
        cap = f", at most {self.concurrency} in flight" if self.concurrency else ""
        if self.mode == "poisson":
            return f"Poisson arrivals at {self.rate:g}/s{cap}"
        return f"trace arrival times{cap}"


def pacing_from(rate: float | None, concurrency: int | None, default_concurrency: int) -> Pacing:
    """Closed loop unless a rate is given (then Poisson, concurrency as cap)."""
    if rate:
        return Pacing("poisson", concurrency or 0, rate)
    return Pacing("closed", concurrency or default_concurrency)


@dataclass(frozen=True)
class Workload:
    name: str
    conversations: tuple[Conversation, ...]
    pacing: Pacing
    ignore_eos: bool = True
    """Ask the engine for exactly ``max_tokens`` tokens (vLLM's ``ignore_eos``)."""
    params: dict[str, Any] = field(default_factory=dict)
    """The parameters the workload was built from, for the report."""

    @property
    def request_count(self) -> int:
        return sum(len(c.turns) for c in self.conversations)


def poisson_arrivals(count: int, rate: float, rng: random.Random) -> list[float]:
    """``count`` arrival times of a Poisson process of ``rate`` per second."""
    if rate <= 0:
        raise ValueError("rate must be positive")
    now = 0.0
    times = []
    for _ in range(count):
        now += rng.expovariate(rate)
        times.append(now)
    return times


def paced(conversations: list[Conversation], pacing: Pacing, seed: int) -> tuple[Conversation, ...]:
    """Give the conversations Poisson arrival times when the pacing is open loop."""
    if pacing.mode != "poisson":
        return tuple(conversations)
    assert pacing.rate is not None
    times = poisson_arrivals(len(conversations), pacing.rate, random.Random(f"arrivals-{seed}"))
    return tuple(
        Conversation(c.id, c.group, c.turns, c.system, at, c.system_clock)
        for c, at in zip(conversations, times)
    )
