"""Deterministic "model output" for the simulated engine.

Every generated token is one word from a fixed vocabulary, drawn by a RNG
seeded from (server seed, request seed or a hash of the prompt, choice
index): the same request always produces the same text, and the choices of
an ``n > 1`` request differ from each other.

How long an answer is:

* ``ignore_eos``: exactly ``max_tokens`` words, finish reason ``length``.
* otherwise a natural length ``L`` is drawn from ``[len_min, len_max]`` (and
  raised to ``min_tokens + 1``). If ``L <= max_tokens`` the answer is
  ``L - 1`` words followed by an EOS token that adds no text (finish reason
  ``stop``, ``stop_reason`` null, ``L`` completion tokens, as vLLM counts the
  EOS token); else ``max_tokens`` words, finish reason ``length``.

A scripted answer (``OutputSpec.script``: the JSON of ``response_format``, a
tool call's arguments; see ``engine.sim.answers``) is those pieces in order,
one token each, then the EOS token; ``max_tokens`` cuts it short (``length``)
as it would cut a real model's guided output. ``min_tokens`` and
``ignore_eos`` do not lengthen it: guided decoding ends where the grammar does.

Stop strings end the answer at the first match (finish reason ``stop``,
``stop_reason`` the matched string; the string itself is cut off unless
``include_stop_str_in_output``). As vLLM's detokenizer does, a stream holds
back the last ``len(longest stop) - 1`` characters until they can no longer
start a stop string, so no part of a stop string is ever sent.
"""

from __future__ import annotations

import hashlib
import random
import zlib
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

VOCABULARY: tuple[str, ...] = (
    "the",
    "model",
    "cache",
    "prefix",
    "block",
    "token",
    "request",
    "replica",
    "router",
    "latency",
    "batch",
    "decode",
    "prefill",
    "queue",
    "engine",
    "memory",
    "hit",
    "miss",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "and",
    "then",
    "again",
    "simulated",
    "answer",
    "with",
    "some",
    "words",
    "that",
    "mean",
    "nothing",
    "at",
    "all",
    "but",
    "look",
    "plausible",
    "enough",
    "for",
    "a",
    "benchmark",
    "to",
    "count",
    "them",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "alpha",
    "beta",
    "gamma",
    "delta",
)
FIRST_WORD_TOKEN_ID = 1000
"""Synthetic token ids of the vocabulary: ``FIRST_WORD_TOKEN_ID + index``."""
EOS_TOKEN_ID = 2
FIRST_SCRIPT_TOKEN_ID = 5000
"""Synthetic ids of scripted pieces: ``FIRST_SCRIPT_TOKEN_ID`` plus a hash of the text."""


def prompt_seed(token_ids: Sequence[int]) -> int:
    digest = hashlib.blake2b(array("Q", token_ids).tobytes(), digest_size=8)
    return int.from_bytes(digest.digest(), "big")


@dataclass(frozen=True, slots=True)
class OutputSpec:
    """What a choice should generate; derived from the request by the server."""

    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    seed: int | None = None
    script: tuple[str, ...] | None = None
    """The answer's pieces, one token each, instead of words drawn at random."""


@dataclass(frozen=True, slots=True)
class TokenStep:
    token_id: int
    delta_text: str
    finish_reason: str | None
    stop_reason: str | None
    token_text: str = ""
    """This token's own text (what logprobs name it), before stop-string hold-back."""


def choice_key(seed: int | None, prompt_token_ids: Sequence[int], index: int,
               server_seed: int) -> str:
    """What one choice's randomness is seeded with.

    A request seed alone fixes the answer, as on identical vLLM replicas;
    without one the server's seed and the prompt do."""
    if seed is not None:
        return f"request:{seed}:{index}"
    return f"{server_seed}:{prompt_seed(prompt_token_ids)}:{index}"


class OutputText:
    """The answer of one choice, produced one token at a time."""

    def __init__(
        self,
        spec: OutputSpec,
        prompt_token_ids: Sequence[int],
        index: int,
        server_seed: int,
        len_min: int,
        len_max: int,
    ) -> None:
        self._rng = random.Random(choice_key(spec.seed, prompt_token_ids, index, server_seed))
        self._spec = spec
        if spec.script is not None:
            length = len(spec.script)
            if length < spec.max_tokens:
                self._words, self._finish = length, "stop"
            else:
                self._words, self._finish = spec.max_tokens, "length"
        elif spec.ignore_eos:
            self._words, self._finish = spec.max_tokens, "length"
        else:
            natural = max(self._rng.randint(len_min, len_max), spec.min_tokens + 1)
            if natural <= spec.max_tokens:
                self._words, self._finish = natural - 1, "stop"
            else:
                self._words, self._finish = spec.max_tokens, "length"
        self._holdback = max((len(stop) for stop in spec.stop), default=1) - 1
        self.text = ""
        self.num_tokens = 0
        self._sent = 0
        self.finished = False

    def next_token(self) -> TokenStep:
        if self.finished:
            raise RuntimeError("output already finished")
        self.num_tokens += 1
        if self.num_tokens > self._words:
            # The natural end: an EOS token, which adds no text.
            return self._finish_with(EOS_TOKEN_ID, "stop", None)
        token_id, piece = self._next_piece()
        search_from = max(0, len(self.text) - self._holdback)
        self.text += piece
        match = self._find_stop(search_from)
        if match is not None:
            position, stop = match
            end = position + len(stop) if self._spec.include_stop_str_in_output else position
            self.text = self.text[:end]
            return self._finish_with(token_id, "stop", stop, piece)
        if self.num_tokens == self._words and self._finish == "length":
            return self._finish_with(token_id, "length", None, piece)
        visible = len(self.text) - self._holdback
        delta = self.text[self._sent : visible] if visible > self._sent else ""
        self._sent = max(self._sent, visible)
        return TokenStep(token_id, delta, None, None, piece)

    def _next_piece(self) -> tuple[int, str]:
        script = self._spec.script
        if script is not None:
            piece = script[self.num_tokens - 1]
            return FIRST_SCRIPT_TOKEN_ID + zlib.crc32(piece.encode()) % 50_000, piece
        word_index = self._rng.randrange(len(VOCABULARY))
        word = VOCABULARY[word_index]
        return FIRST_WORD_TOKEN_ID + word_index, word if not self.text else " " + word

    def _find_stop(self, search_from: int) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._spec.stop:
            position = self.text.find(stop, search_from)
            if position >= 0 and (best is None or position < best[0]):
                best = (position, stop)
        return best

    def _finish_with(
        self, token_id: int, reason: str, stop_reason: str | None, piece: str = ""
    ) -> TokenStep:
        self.finished = True
        delta = self.text[self._sent :]
        self._sent = len(self.text)
        return TokenStep(token_id, delta, reason, stop_reason, piece)
