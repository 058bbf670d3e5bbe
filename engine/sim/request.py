"""One sequence inside the simulated engine, and what it reports back.

A chat request with ``n = 2`` becomes two :class:`EngineRequest` values that
share a prompt; each reports its tokens through its own ``emit`` callback as
:class:`TokenEvent` values. All times are modeled seconds.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from engine.sim.textgen import TokenStep


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(frozen=True, slots=True)
class TokenEvent:
    index: int
    delta_text: str
    token_id: int
    num_output_tokens: int
    num_prompt_tokens: int
    num_cached_tokens: int
    finish_reason: str | None
    stop_reason: str | None
    token_text: str = ""
    """The sampled token's own text (for logprobs); ``delta_text`` may hold it back."""


class TokenSource(Protocol):
    """Where a sequence's output tokens come from: ``engine.sim.textgen.OutputText`` for
    a served request; a replay (``gateway.replay``) needs only their number."""

    def next_token(self) -> TokenStep: ...


@dataclass(eq=False, slots=True)
class EngineRequest:
    request_id: str
    index: int
    prompt_token_ids: list[int]
    output: TokenSource
    emit: Callable[[TokenEvent], None]
    cache_salt: str | None = None
    max_tokens: int = 0
    n: int = 1

    token_ids: list[int] = field(default_factory=list)
    """Prompt followed by the tokens generated so far."""
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_blocks: int = 0
    num_cached_tokens: int = -1
    """Prompt tokens found in the prefix cache the first time it was scheduled."""
    status: Status = Status.WAITING

    arrival_time: float = 0.0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def is_decoding(self) -> bool:
        """Only the last sampled token is left to compute."""
        return self.num_output_tokens > 0 and self.num_computed_tokens == self.num_tokens - 1
