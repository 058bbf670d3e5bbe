"""``multi-turn``: chat users whose whole history is the next turn's prefix.

``users`` users each hold a conversation of ``rounds`` turns behind one
system prompt of ``system_len`` tokens shared by everybody. Turn ``k`` of a
user carries the system prompt, the user's ``k - 1`` earlier questions and
the answers the server actually gave, then a new question of
``question_len`` tokens, and asks for ``output_len`` tokens. The next turn is
sent only after the previous answer has arrived (the load generator appends
the real answer text), so the prompt a replica sees grows by one question
and one answer per round, and everything but the newest question is a
prefix the replica that served the previous turn already holds.

A router that keeps each user on one replica serves the history from cache;
one that scatters users re-computes it, and once the replicas' caches are
smaller than ``users * history`` tokens it also evicts other users' history.

Pacing: closed loop by default (``concurrency`` users talking at once, a new
user starting when one finishes), or Poisson user arrivals at ``rate``.
Lengths are words, each exactly one Qwen3 token (see :mod:`.text`).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from loadtest.workloads.base import Conversation, Turn, Workload, paced, pacing_from
from loadtest.workloads.text import words


@dataclass(frozen=True, slots=True)
class MultiTurnParams:
    users: int = 32
    rounds: int = 8
    system_len: int = 1024
    question_len: int = 96
    output_len: int = 128
    seed: int = 0
    rate: float | None = None
    """Poisson user arrivals per second; ``None`` runs closed loop."""
    concurrency: int | None = None
    """Closed loop: users talking at once (default 16). Open loop: cap on requests."""

    def __post_init__(self) -> None:
        for name in ("users", "rounds", "system_len", "question_len", "output_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


def build(params: MultiTurnParams) -> Workload:
    system = words(f"multi-turn/system/{params.seed}", params.system_len)
    conversations = []
    for user in range(params.users):
        turns = tuple(
            Turn(
                words(f"multi-turn/question/{params.seed}/{user}/{round_}", params.question_len),
                params.output_len,
            )
            for round_ in range(params.rounds)
        )
        conversations.append(Conversation(id=f"u{user}", group=f"u{user}", turns=turns, system=system))
    random.Random(f"multi-turn/order/{params.seed}").shuffle(conversations)
    pacing = pacing_from(params.rate, params.concurrency, default_concurrency=16)
    return Workload(
        name="multi-turn",
        conversations=paced(conversations, pacing, params.seed),
        pacing=pacing,
        params=dataclasses.asdict(params),
    )
