"""Where the detector looks: small windows of text around cheap seeds.

A seed is a digit cluster or a literal cue word found with ``str.find``; a
window is the text around it, grown to the end of the token it cuts so that
no match is cut short by the window's edge (``token_end``), and merged with
its neighbours (``merged``). ``valid`` drops failed validations and any hit
that ends exactly where a window cut a word.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from gateway.lint.model import Hit

TOKEN_REACH = 300
"""How far a window grows to take in a whole token (ids, nonces)."""
TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/_=-.")
Window = tuple[int, int]


@dataclass(slots=True)
class DigitWindow:
    """A stretch of text around digit clusters, with what decides which families run."""

    start: int
    end: int
    longest: int
    """Longest run of digits."""
    digits: int
    tokenish: bool
    """Some digits touch letters: an id, a hash, a nonce."""


def text_before(t: str, index: int) -> str:
    """The 24 characters before ``index``: the context a validator looks back at."""
    return t[max(0, index - 24):index]


def token_end(t: str, index: int) -> int:
    """Grow a window's end to the end of the token it cuts (a space or newline)."""
    high = min(len(t), index + TOKEN_REACH)
    ends = [i for i in (t.find(" ", index, high), t.find("\n", index, high)) if i >= 0]
    return min(ends) if ends else high


def positions(t: str, literal: str) -> Iterator[int]:
    index = t.find(literal)
    while index != -1:
        yield index
        index = t.find(literal, index + 1)


def find_all(t: str, literal: str, before: int, after: int) -> Iterator[Window]:
    for index in positions(t, literal):
        yield index - before, index + len(literal) + after


def find_words(lowered: str, literals: Iterable[str], before: int,
                after: int) -> list[Window]:
    """Windows around each literal; ASCII literals only where a word starts."""
    out: list[Window] = []
    for literal in literals:
        word = literal[0].isascii() and literal[0].isalpha()
        for index in positions(lowered, literal):
            if word and index and lowered[index - 1].isalpha():
                continue
            out.append((index - before, index + len(literal) + after))
    return out


def merged(windows: Iterable[Window], n: int) -> list[Window]:
    out: list[Window] = []
    for a, b in sorted(windows):
        a, b = max(0, a), min(n, b)
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def valid(t: str, b: int, found: Sequence[Hit | None]) -> Iterator[Hit]:
    """Drop failed validations, and hits that end where a window cut a word."""
    cut = b < len(t) and t[b - 1:b + 1].isalnum()
    for hit in found:
        if hit is not None and not (cut and hit.end == b):
            yield hit


def group_hit(match: re.Match[str], group: str, kind: str, confidence: float) -> Hit:
    return Hit(kind, match.start(group), match.end(group), confidence)
