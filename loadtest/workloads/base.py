"""The value every workload produces: conversations with arrival times.

A workload is a seeded, deterministic list of :class:`Conversation` values
plus how to pace them (:class:`Pacing`). A conversation has an optional
system prompt and one or more user turns; the load generator sends turn
``k`` with the whole history so far (system, every earlier user turn and the
*real* answer the server gave to it) and issues turn ``k + 1`` only after
the answer to turn ``k`` arrived. Single-shot workloads (shared-prefix,
mooncake) are conversations of one turn.

How a turn's request is built is the conversation's choice (built by
:mod:`loadtest.transcript`):

* ``history="messages"`` (default): the earlier user turns and the real
  answers as chat messages, as above;
* ``history="flattened"``: ONE user message that grows: turn ``k``'s message
  is turn ``k - 1``'s message text, the real answer to it and the new
  ``user`` text, joined by blank lines (the Mooncake shape: each request's
  single message extends an earlier request's text);
* ``history="scripted"``: each turn brings its own ``script`` of messages
  (a user task, an assistant ``tool_calls`` message, a ``tool`` result ...),
  the history is the scripts so far, and the real answers are dropped (what
  an agent framework resends around a tool loop; no answer is needed).

``endpoint="completions"`` sends the text to ``/v1/completions`` as a
``prompt`` (the system text, a blank line, then the user text, flattened
across turns) instead of chat ``messages``. ``tools`` (OpenAI ``tools``
JSON) and ``tool_choice`` go with every chat request of the conversation.

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

import dataclasses
import random
from dataclasses import dataclass, field
from typing import Any, Literal

PacingMode = Literal["closed", "poisson", "trace"]
History = Literal["messages", "flattened", "scripted"]
Endpoint = Literal["chat", "completions"]


@dataclass(frozen=True, slots=True)
class Turn:
    user: str
    """The new user text (unused by a ``scripted`` conversation)."""
    max_tokens: int
    script: tuple[dict[str, Any], ...] = ()
    """``scripted`` conversations only: the messages this turn adds, sent as
    given (read-only); the last one ends the request."""


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
    history: History = "messages"
    endpoint: Endpoint = "chat"
    tools: tuple[dict[str, Any], ...] = ()
    """OpenAI ``tools`` definitions sent with every request (read-only)."""
    tool_choice: str | None = None
    """Sent with the tools when set (``"none"`` keeps tools in the prompt on
    any vLLM server; ``"auto"`` needs one started with a tool-call parser)."""

    def __post_init__(self) -> None:
        scripted = [bool(turn.script) for turn in self.turns]
        if self.history == "scripted" and not all(scripted):
            raise ValueError(f"{self.id}: every turn of a scripted conversation needs a script")
        if self.history != "scripted" and any(scripted):
            raise ValueError(f"{self.id}: only a scripted conversation has turn scripts")
        if self.endpoint == "completions":
            if self.history == "scripted" or self.tools:
                raise ValueError(f"{self.id}: a completions conversation has no scripts or tools")
            if self.history == "messages" and len(self.turns) > 1:
                raise ValueError(f"{self.id}: a multi-turn completions conversation needs "
                                 "flattened history")

    @property
    def needs_answers(self) -> bool:
        """Whether a later turn's prompt holds an earlier answer's text."""
        return len(self.turns) > 1 and self.history != "scripted"


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
    return tuple(dataclasses.replace(c, arrival=at) for c, at in zip(conversations, times))
