"""Compatibility folding for matching, with exact offsets back to the original.

Patterns match on NFKC text so that full-width digits and punctuation
(``２０２６年１１月３０日``, ``１５：２５``), ideographic spaces and
no-break spaces look like their ASCII forms. NFKC is applied per character
(compatibility folding; canonical composition across characters does not
matter to any pattern here), which keeps a simple map from every folded
character back to the original one.

Speed matters (a long Chinese system prompt is full of full-width commas):
ASCII text and text already in NFKC come back as they are. Otherwise one
scan collects the characters outside the always-stable ranges (ASCII, CJK
ideographs, kana, Hangul syllables, common CJK punctuation); each distinct
one is folded once. When they all fold to a single character, a few
``str.replace`` calls fold the text and offsets do not move. Only expanding
characters (``㍻`` -> ``平成``, ``ﬁ`` -> ``fi``) take the slow path.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Folded:
    text: str
    """The folded text the patterns see."""
    origin: tuple[int, ...] | None
    """For each folded character, the index of the original character; None = identity."""
    original_length: int

    def to_original(self, start: int, end: int) -> tuple[int, int]:
        """Map a folded span back to the original text."""
        if self.origin is None:
            return start, end
        o_start = self.origin[start] if start < len(self.origin) else self.original_length
        if end <= start:
            return o_start, o_start
        return o_start, self.origin[end - 1] + 1


class Folder:
    def __init__(self) -> None:
        self._maybe_unstable = re.compile(
            "[^\x00-\x7f\u4e00-\u9fff\u3041-\u3096\u3099\u309a\u309d\u309e\u30a0-\u30fe"
            "\uac00-\ud7a3\u3001-\u3035\u303b-\u303f]")

    def fold(self, text: str) -> Folded:
        if text.isascii() or unicodedata.is_normalized("NFKC", text):
            return Folded(text, None, len(text))
        table: dict[str, str] = {}
        for char in set(self._maybe_unstable.findall(text)):
            folded = unicodedata.normalize("NFKC", char)
            if folded != char:
                table[char] = folded
        if all(len(v) == 1 for v in table.values()):
            for char, folded in table.items():
                text = text.replace(char, folded)
            return Folded(text, None, len(text))
        pieces = [table.get(c, c) for c in text]
        origin: list[int] = []
        for index, piece in enumerate(pieces):
            origin.extend([index] * len(piece))
        return Folded("".join(pieces), tuple(origin), len(text))
