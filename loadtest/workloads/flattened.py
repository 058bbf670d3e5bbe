"""``flattened``: multi-turn conversations sent as ONE growing user message.

Many clients (and the Mooncake trace's requests) do not send a chat history
as messages: they paste the whole conversation so far into a single user
message. ``users`` users each hold a conversation of ``rounds`` turns; every
request has exactly one user message (behind an optional shared system
prompt of ``system_len`` tokens, none by default):

* turn 0: an opening text of ``first_len`` tokens (a pasted context and the
  first ask);
* turn ``k``: turn ``k - 1``'s message text, a blank line, the real answer
  the server gave to it, a blank line and ``turn_len`` new tokens.

Each answer asks for ``output_len`` tokens, and turn ``k + 1`` is sent only
after turn ``k``'s answer arrived (the load generator splices its text in:
``history="flattened"``, see :mod:`loadtest.transcript`). So each request's
one message extends an earlier request's message: everything up to the end
of the previous message text is a prefix the replica that served the
previous turn holds, while the answer (generated, then re-sent as prompt
text after it) is computed again, unlike in ``multi-turn``.

Pacing: closed loop by default (``concurrency`` users at once), or Poisson
user arrivals at ``rate``. Lengths are words, each exactly one Qwen3 token
(see :mod:`.text`).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from loadtest.workloads.base import Conversation, Turn, Workload, paced, pacing_from
from loadtest.workloads.text import words


@dataclass(frozen=True, slots=True)
class FlattenedParams:
    users: int = 32
    rounds: int = 8
    first_len: int = 1024
    """Tokens of the first message."""
    turn_len: int = 96
    """New user tokens each later turn adds."""
    output_len: int = 128
    system_len: int = 0
    """A system prompt shared by every user; 0: none."""
    seed: int = 0
    rate: float | None = None
    """Poisson user arrivals per second; ``None`` runs closed loop."""
    concurrency: int | None = None
    """Closed loop: users talking at once (default 16). Open loop: cap on requests."""

    def __post_init__(self) -> None:
        for name in ("users", "rounds", "first_len", "turn_len", "output_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.system_len < 0:
            raise ValueError("system_len must not be negative")


def build(params: FlattenedParams) -> Workload:
    system = words(f"flattened/system/{params.seed}", params.system_len) or None
    conversations = []
    for user in range(params.users):
        turns = tuple(
            Turn(
                words(f"flattened/turn/{params.seed}/{user}/{round_}",
                      params.first_len if round_ == 0 else params.turn_len),
                params.output_len,
            )
            for round_ in range(params.rounds)
        )
        conversations.append(Conversation(id=f"u{user}", group=f"u{user}", turns=turns,
                                          system=system, history="flattened"))
    random.Random(f"flattened/order/{params.seed}").shuffle(conversations)
    pacing = pacing_from(params.rate, params.concurrency, default_concurrency=16)
    return Workload(
        name="flattened",
        conversations=paced(conversations, pacing, params.seed),
        pacing=pacing,
        params=dataclasses.asdict(params),
    )
