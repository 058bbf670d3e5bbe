"""``burst``: N requests at once, behind one or several new shared prefixes.

What ``vllm bench serve`` sends by default (``--request-rate inf``): every
request of the run at the same instant. Each of ``bursts`` bursts is
``burst_size`` requests sent together, spread evenly over ``prefixes``
shared prefixes of ``prefix_len`` tokens that no earlier burst used (a
system prompt the replicas have never seen), each request with its own
``question_len``-token question, answered with ``output_len`` tokens.
With ``repeats`` > 0 each burst is sent ``repeats`` more times with the
same prefixes (new questions): the second time, every replica that took
part may already hold them. Bursts start ``gap`` seconds apart, long enough
for one to finish before the next (the report counts requests per replica
per burst from the replicas' own counters between two bursts).

What a router should do with it: the first request of a prefix pays its
prefill; the others either join it on that replica or pay it elsewhere,
whichever finishes sooner, and no replica takes much more than its share.
Lengths are words, each exactly one Qwen3 token (see :mod:`.text`).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from loadtest.workloads.base import Conversation, Pacing, Turn, Workload
from loadtest.workloads.text import words

GROUP_PREFIX = "burst-"
"""Conversations of burst ``k`` have the group ``burst-k`` (the report's per-burst figures)."""


@dataclass(frozen=True, slots=True)
class BurstParams:
    bursts: int = 3
    burst_size: int = 100
    prefixes: int = 1
    prefix_len: int = 512
    question_len: int = 32
    output_len: int = 64
    repeats: int = 0
    gap: float = 10.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("bursts", "burst_size", "prefixes", "prefix_len", "question_len",
                     "output_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.repeats < 0:
            raise ValueError("repeats must not be negative")
        if self.gap <= 0:
            raise ValueError("gap must be positive")
        if self.prefixes > self.burst_size:
            raise ValueError("prefixes must not exceed burst_size")


def build(params: BurstParams) -> Workload:
    conversations = []
    sent = 0
    for burst in range(params.bursts):
        systems = [words(f"burst/system/{params.seed}/{burst}/{p}", params.prefix_len)
                   for p in range(params.prefixes)]
        for repeat in range(params.repeats + 1):
            at = sent * params.gap
            batch = []
            for i in range(params.burst_size):
                question = words(f"burst/question/{params.seed}/{burst}/{repeat}/{i}",
                                 params.question_len)
                batch.append(Conversation(
                    id=f"b{sent}-r{i}", group=f"{GROUP_PREFIX}{sent}",
                    turns=(Turn(question, params.output_len),),
                    system=systems[i % params.prefixes], arrival=at))
            random.Random(f"burst/order/{params.seed}/{sent}").shuffle(batch)
            conversations += batch
            sent += 1
    return Workload(name="burst", conversations=tuple(conversations),
                    pacing=Pacing("trace", concurrency=0),
                    params=dataclasses.asdict(params))
