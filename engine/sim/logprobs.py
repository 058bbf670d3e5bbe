"""Log-probabilities of the simulator's tokens, in vLLM's two shapes.

The simulated model is sure of what it says: the sampled token is always
the most likely one (rank 1), with a log-probability in (-2, 0); its
alternatives are other vocabulary words, each less likely than the one
before. All of it is a function of (the choice's seed key, the token's
position, its text), so a request asked twice gets the same numbers.

* Chat (``logprobs: true``, ``top_logprobs: k``): per token
  ``{"token", "logprob", "bytes", "top_logprobs": [k entries]}``, the
  sampled token first, as vLLM lists its rank-1 token.
* Completions (``logprobs: k``): ``{"text_offset", "token_logprobs",
  "tokens", "top_logprobs"}`` with a ``{token: logprob}`` map of ``k``
  entries (one for ``k = 0``: the sampled token). With ``echo`` the prompt's
  tokens come first; the very first has no logprob (``None``), as in vLLM.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.sim.textgen import VOCABULARY


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token: str
    logprob: float
    top: tuple[tuple[str, float], ...]
    """The sampled token and its alternatives, most likely first."""


def token_logprob(key: str, position: int, token: str, count: int) -> TokenLogprob:
    rng = random.Random(f"logprob:{key}:{position}:{token}")
    logprob = -round(rng.uniform(0.0005, 2.0), 4)
    top: list[tuple[str, float]] = [(token, logprob)]
    lead = " " if token.startswith(" ") else ""
    below = logprob
    seen = {token}
    while len(top) < count:
        alternative = lead + rng.choice(VOCABULARY)
        if alternative in seen:
            continue
        seen.add(alternative)
        below = round(below - rng.uniform(0.05, 2.5), 4)
        top.append((alternative, below))
    return TokenLogprob(token, logprob, tuple(top))


def _bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat_entry(item: TokenLogprob, count: int) -> dict[str, Any]:
    return {
        "token": item.token,
        "logprob": item.logprob,
        "bytes": _bytes(item.token),
        "top_logprobs": [
            {"token": token, "logprob": logprob, "bytes": _bytes(token)}
            for token, logprob in item.top[:count]
        ],
    }


def chat_logprobs(items: Sequence[TokenLogprob], count: int) -> dict[str, Any]:
    return {"content": [chat_entry(item, count) for item in items]}


@dataclass
class CompletionLogprobs:
    """The completion shape, built token by token (a stream sends slices of it)."""

    count: int
    offset: int = 0
    """Character offset of the next token in the choice's text."""

    def shape(self, items: Sequence[TokenLogprob | str]) -> dict[str, Any]:
        """``items``: a scored token, or a bare token text (the prompt's first)."""
        text_offset: list[int] = []
        token_logprobs: list[float | None] = []
        tokens: list[str] = []
        top_logprobs: list[dict[str, float] | None] = []
        for item in items:
            text_offset.append(self.offset)
            if isinstance(item, str):
                tokens.append(item)
                token_logprobs.append(None)
                top_logprobs.append(None)
                self.offset += len(item)
                continue
            tokens.append(item.token)
            token_logprobs.append(item.logprob)
            top_logprobs.append(dict(item.top[: max(self.count, 1)]))
            self.offset += len(item.token)
        return {
            "text_offset": text_offset,
            "token_logprobs": token_logprobs,
            "tokens": tokens,
            "top_logprobs": top_logprobs,
        }


def prompt_items(key: str, token_texts: Sequence[str], count: int) -> list[TokenLogprob | str]:
    """The prompt's tokens as ``echo`` reports them: the first bare, the rest scored."""
    items: list[TokenLogprob | str] = []
    for position, text in enumerate(token_texts):
        if position == 0:
            items.append(text)
        else:
            items.append(token_logprob(f"prompt:{key}", position, text, count))
    return items
