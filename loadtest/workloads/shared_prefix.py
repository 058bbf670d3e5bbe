"""``shared-prefix``: many apps, each with a long system prompt of its own.

The shape of SGLang's "generated shared prefix" benchmark: ``groups`` apps,
each with a system prompt of ``system_len`` tokens, and ``prompts_per_group``
different user questions of ``question_len`` tokens per app, each answered
with ``output_len`` tokens. The whole set of ``groups * prompts_per_group``
requests is shuffled (seeded), so requests of one app arrive spread over the
run. A router that keeps an app on the replica already holding its system
prompt serves ``(prompts_per_group - 1) / prompts_per_group`` of the system
prompt tokens from cache; a blind one re-computes it on every replica the
app visits, and evicts other apps' prompts while doing so when the replicas'
caches are smaller than the working set (``groups * system_len`` tokens).

Defaults are SGLang's: 64 groups x 16 prompts, 2048 / 128 / 256 tokens.
Lengths are words, each exactly one Qwen3 token (see :mod:`.text`).

``dynamic-prefix`` (:func:`build_dynamic`) is the same set of apps with the
current time planted at the start of every system prompt (the load
generator fills it in when it sends the request): nothing after that first
line can be cached, whatever the router does.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from loadtest.workloads.base import Conversation, Turn, Workload, paced, pacing_from
from loadtest.workloads.text import words


@dataclass(frozen=True, slots=True)
class SharedPrefixParams:
    groups: int = 64
    prompts_per_group: int = 16
    system_len: int = 2048
    question_len: int = 128
    output_len: int = 256
    seed: int = 0
    rate: float | None = None
    """Poisson arrivals per second; ``None`` runs closed loop."""
    concurrency: int | None = None
    """Closed loop: requests in flight (default 16). Open loop: cap (default none)."""

    def __post_init__(self) -> None:
        for name in ("groups", "prompts_per_group", "system_len", "question_len", "output_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")


def _build(params: SharedPrefixParams, name: str, system_clock: bool) -> Workload:
    conversations = []
    for group in range(params.groups):
        system = words(f"shared-prefix/system/{params.seed}/{group}", params.system_len)
        for prompt in range(params.prompts_per_group):
            question = words(
                f"shared-prefix/question/{params.seed}/{group}/{prompt}", params.question_len
            )
            conversations.append(
                Conversation(
                    id=f"g{group}-p{prompt}",
                    group=f"g{group}",
                    turns=(Turn(question, params.output_len),),
                    system=system,
                    system_clock=system_clock,
                )
            )
    random.Random(f"shared-prefix/order/{params.seed}").shuffle(conversations)
    pacing = pacing_from(params.rate, params.concurrency, default_concurrency=16)
    return Workload(
        name=name,
        conversations=paced(conversations, pacing, params.seed),
        pacing=pacing,
        params=dataclasses.asdict(params),
    )


def build(params: SharedPrefixParams) -> Workload:
    return _build(params, "shared-prefix", system_clock=False)


def build_dynamic(params: SharedPrefixParams) -> Workload:
    return _build(params, "dynamic-prefix", system_clock=True)
