"""Where a character of a rendered prompt falls among its tokens.

``TokenMap.index(prompt)`` gives the prompt's token count and, for any
character offset, the first token that covers it or comes after it: the
first token a change at that character would alter.

Like ``gateway.prompt.render``, the prompt is cut at the tokenizer's added tokens
(``<|im_start|>`` ...), which Hugging Face tokenizers split out before
anything else, and each piece's token offsets are memoized: a system prompt
shared by many requests is tokenized once. Whether cutting is exact is
checked once on a sample when the map is built.

Two encoders: the model's ``tokenizer.json`` through the ``tokenizers``
library (the same tokenizer transformers wraps), or one token per UTF-8
byte for the byte-level fallback renderer.
"""

from __future__ import annotations

import os
import re
import threading
from array import array
from bisect import bisect_right
from dataclasses import dataclass
from typing import Protocol

from engine.tokenizer import unencodable
from policies.lru import LRU


class Encoder(Protocol):
    def ends(self, text: str) -> array:
        """For each token of ``text`` (no special tokens added), its end character offset."""
        ...

    def specials(self) -> list[str]:
        ...


class HFEncoder:
    def __init__(self, folder: str) -> None:
        from tokenizers import Tokenizer  # heavy: loaded only when a folder is linted

        self._tokenizer = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))

    def ends(self, text: str) -> array:
        try:
            encoding = self._tokenizer.encode(text, add_special_tokens=False)
        except TypeError as exc:
            raise unencodable(text, exc) from exc
        return array("l", (end for _, end in encoding.offsets))

    def specials(self) -> list[str]:
        return [t.content for t in self._tokenizer.get_added_tokens_decoder().values()]


class ByteEncoder:
    """One token per UTF-8 byte (``engine.tokenizer.ByteRenderer``)."""

    def ends(self, text: str) -> array:
        out = array("l")
        try:
            for index, char in enumerate(text):
                out.extend([index + 1] * len(char.encode("utf-8")))
        except UnicodeEncodeError as exc:
            raise unencodable(text, exc) from exc
        return out

    def specials(self) -> list[str]:
        return []


@dataclass(frozen=True, slots=True)
class PromptTokens:
    total: int
    piece_starts: tuple[int, ...]
    """Character offset of each piece."""
    piece_tokens: tuple[int, ...]
    """Tokens before each piece."""
    piece_ends: tuple[array, ...]

    def token_at(self, char: int) -> int:
        """Index of the first token that ends after ``char`` (the first one it affects)."""
        piece = max(0, bisect_right(self.piece_starts, char) - 1)
        if piece >= len(self.piece_starts):
            return self.total
        local = char - self.piece_starts[piece]
        return min(self.total, self.piece_tokens[piece]
                   + bisect_right(self.piece_ends[piece], local))


class TokenMap:
    def __init__(self, encoder: Encoder, cache_pieces: int = 4096) -> None:
        self.encoder = encoder
        self._memo: LRU[str, array] = LRU(cache_pieces)
        self._lock = threading.Lock()  # the lint endpoint runs in worker threads
        specials = sorted(set(encoder.specials()), key=len, reverse=True)
        self._split = (re.compile("(" + "|".join(re.escape(s) for s in specials) + ")")
                       if specials else None)
        if self._split is not None and not self._cutting_is_exact(specials):
            self._split = None

    def _cutting_is_exact(self, specials: list[str]) -> bool:
        sample = (f"{specials[0]}system\nYou are terse. 系统 \n{specials[-1]}\n"
                  f"{specials[0]}user\n  Hi!\n\nok? 你好 {specials[-1]}\n")
        whole = len(self.encoder.ends(sample))
        pieced = sum(len(self.encoder.ends(p)) for p in self._pieces(sample))
        return whole == pieced

    def _pieces(self, text: str) -> list[str]:
        if self._split is None:
            return [text]
        return [p for p in self._split.split(text) if p]

    def index(self, prompt: str) -> PromptTokens:
        starts: list[int] = []
        tokens: list[int] = []
        ends: list[array] = []
        char = total = 0
        for piece in self._pieces(prompt):
            with self._lock:
                piece_ends = self._memo.get(piece)
            if piece_ends is None:
                piece_ends = self.encoder.ends(piece)
                with self._lock:
                    self._memo.put(piece, piece_ends)
            starts.append(char)
            tokens.append(total)
            ends.append(piece_ends)
            char += len(piece)
            total += len(piece_ends)
        return PromptTokens(total, tuple(starts), tuple(tokens), tuple(ends))
