"""Tokenize a new piece of prompt from the known piece it shares leading text with.

A piece never seen whole often starts with text that was: a user message
that grows from request to request (a conversation sent as one message), a
document with a new question appended, a completions prompt that extends an
earlier one. Tokenizing it in full costs ~1 µs per token (14 ms at 16k);
this module finds the longest known piece it shares leading text with and
tokenizes only from a clean cut point before the two texts part.

Algorithm:

* Learning (off the request's path): for a tokenized piece of at least
  ``min_chars``, every ``step`` characters a chained hash of its text so far
  (``h_k = xxh3_64(text[(k-1)*step : k*step], seed=h_{k-1})``) is mapped to a
  *mark*: the piece and the last clean cut at or before that point. A clean
  cut is a character position ``c`` where a token of the piece ends and the
  next begins, and the text there is a word boundary the pre-tokenizer always
  splits on whatever follows: a space between two non-space characters, or
  the start of a line after a newline.
* Lookup: the new piece's chain is computed while its hashes are known; the
  last known one names a piece ``P`` that agrees with it at least up to that
  mark, so up to its cut ``c``. The result is ``tokens(P)[:j] +
  tokenize(new[c:])``.
* Verification, every time: ``tokenize(P[c:])`` must equal
  ``tokens(P)[j:]``, i.e. tokenizing from ``c`` afresh reproduces the piece's
  own tokens. That rejects tokenizers that treat the start of a text
  specially (SentencePiece's prepended space, BOS/EOS added to every call),
  and cuts a normalizer or pre-tokenizer does not respect. A rejected cut
  falls back to tokenizing the whole piece.
* Audit: one reuse in ``audit_every`` is compared off the request's path
  with a full tokenization of the piece; one mismatch switches reuse off for
  the model (``PromptHasher`` does this, and counts it).

Parameters: ``step`` (256 chars), ``min_chars`` (1,024: shorter pieces are
tokenized in full, faster than looking them up), ``max_marks`` (200,000
marks) and ``max_bytes`` (64 MiB): a mark keeps its piece's text alive, so
each weighs its share of that text (``step`` characters) besides itself;
the least recently learned go first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import xxhash

from gateway.prompt.bounds import ENTRY_BYTES, text_bytes
from policies.lru import LRU

PieceKey = tuple[bool, str]
"""(add_special_tokens, text): how the hasher's piece memo names a piece."""


class Offsets(Protocol):
    """The part of a ``tokenizers.Encoding`` that cuts need."""

    def char_to_token(self, char_pos: int) -> int | None: ...

    def token_to_chars(self, token_index: int) -> tuple[int, int] | None: ...


@dataclass(frozen=True, slots=True)
class Mark:
    key: PieceKey
    cut_chars: int
    cut_tokens: int


@dataclass(frozen=True, slots=True)
class Shifted:
    """The offsets of a tail tokenized from ``chars`` on, seen from the whole piece."""

    tail: Offsets
    chars: int
    tokens: int

    def char_to_token(self, char_pos: int) -> int | None:
        if char_pos < self.chars:
            return None
        token = self.tail.char_to_token(char_pos - self.chars)
        return None if token is None else token + self.tokens

    def token_to_chars(self, token_index: int) -> tuple[int, int] | None:
        if token_index < self.tokens:
            return None
        span = self.tail.token_to_chars(token_index - self.tokens)
        return None if span is None else (span[0] + self.chars, span[1] + self.chars)


@dataclass(frozen=True, slots=True)
class Reused:
    """A piece tokenized from a known one: its ids, and offsets to learn its new part from."""

    ids: tuple[int, ...]
    offsets: Shifted


Encode = Callable[[str], "tuple[list[int], Offsets]"]
"""Tokenize text with no special tokens added, with the offsets of the tokens."""
LookupIds = Callable[[PieceKey], "tuple[int, ...] | None"]
"""The memoized ids of a known piece, if it is still memoized."""


MARK_BYTES = ENTRY_BYTES + 120
"""A mark itself: its int key, the Mark and its two ints."""


def _hash(chunk: str, seed: int) -> int:
    return xxhash.xxh3_64_intdigest(chunk.encode("utf-8", "surrogatepass"), seed)


class PieceReuse:
    def __init__(self, encode: Encode, step: int = 256, min_chars: int = 1024,
                 max_marks: int = 200_000, max_bytes: int | None = 64 << 20) -> None:
        self._encode = encode
        self.step = step
        self.min_chars = min_chars
        self.max_marks = max_marks
        self.marks: LRU[int, Mark] = LRU(max_marks, max_bytes)
        self._learning = threading.Lock()
        """Learning may run in worker threads (``PromptHasher.run_pending_async``): one
        at a time writes the marks; lookups only read them."""
        self.reuses = 0
        self.rejected = 0

    def __len__(self) -> int:
        return len(self.marks)

    # -- learning --------------------------------------------------------------------

    def learn(self, key: PieceKey, encoding: Offsets) -> None:
        """Mark the clean cuts of a tokenized piece (call off the request's path)."""
        if len(key[1]) < self.min_chars:
            return
        with self._learning:
            self._learn(key, encoding)

    def _learn(self, key: PieceKey, encoding: Offsets) -> None:
        add_special, text = key
        seed = int(add_special)
        size = MARK_BYTES + text_bytes(text) * self.step // len(text)
        for end in range(self.step, len(text) + 1, self.step):
            seed = _hash(text[end - self.step:end], seed)
            cut = self._clean_cut(text, end, encoding)
            # A reused piece's offsets cover only its new part: the marks of the
            # part it shares stay with the piece they were learned from.
            if cut is not None:
                self.marks.put(seed, Mark(key, *cut), size=size)

    def _clean_cut(self, text: str, end: int, encoding: Offsets) -> tuple[int, int] | None:
        """The last clean cut in ``[end - step, end - 2]``: (chars, tokens), or None."""
        low = max(end - self.step, 1)
        for c in _boundaries(text, low, end - 2):
            token = encoding.char_to_token(c)
            if token is None or token == 0:
                continue
            here, before = encoding.token_to_chars(token), encoding.token_to_chars(token - 1)
            if here is not None and before is not None and here[0] == c and before[1] == c:
                return c, token
        return None

    # -- lookup ------------------------------------------------------------------------

    def find(self, key: PieceKey) -> Mark | None:
        """The deepest mark of a known piece the new piece shares leading text with:
        how much of it need not be tokenized (``Mark.cut_chars``). Reads only."""
        add_special, text = key
        if len(text) < self.min_chars:
            return None
        seed, mark = int(add_special), None
        for end in range(self.step, len(text) + 1, self.step):
            seed = _hash(text[end - self.step:end], seed)
            found = self.marks.peek(seed)
            if found is None:
                break
            mark = found
        return mark

    def tokenize(self, key: PieceKey, known_ids: LookupIds,
                 mark: Mark | None = None) -> Reused | None:
        """The piece's ids from a known piece's (``mark``, else :meth:`find`'s), or None
        when none can be used. Reads only (no reordering), so it may run in a thread."""
        _, text = key
        mark = mark if mark is not None else self.find(key)
        if mark is None:
            return None
        ids = known_ids(mark.key)
        known = mark.key[1]
        if ids is None or not text.startswith(known[:mark.cut_chars + 2]):
            return None
        known_tail, _ = self._encode(known[mark.cut_chars:])
        if tuple(known_tail) != ids[mark.cut_tokens:]:
            self.rejected += 1
            return None
        self.reuses += 1
        tail, offsets = self._encode(text[mark.cut_chars:])
        return Reused(ids[:mark.cut_tokens] + tuple(tail),
                      Shifted(offsets, mark.cut_chars, mark.cut_tokens))


def _boundaries(text: str, low: int, high: int, tries: int = 8) -> list[int]:
    """Word boundaries in ``[low, high]``, last first (at most ``tries`` of each kind).

    A space between two non-space characters, or the start of a line after a
    newline: GPT-style pre-tokenizers (GPT-4, Qwen, Llama 3) always split
    there, whatever follows the next character. Anything else (SentencePiece,
    exotic normalizers) is caught by the verification in ``tokenize``.
    """
    found: list[int] = []
    hi = high + 1
    for _ in range(tries):
        c = text.rfind(" ", low, hi)
        if c < 0:
            break
        if not text[c - 1].isspace() and c + 1 < len(text) and not text[c + 1].isspace():
            found.append(c)
        hi = c
    hi = high
    for _ in range(tries):
        n = text.rfind("\n", low - 1, hi)
        if n < 0:
            break
        if n + 1 >= low and not text[n + 1].isspace():
            found.append(n + 1)
        hi = n
    return sorted(found, reverse=True)
