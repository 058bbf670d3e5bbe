"""Learn which spans of a templated text vary between requests (the part regex cannot do).

An app builds its system prompt from a template: most of the text is fixed,
a few slots (the user's name, their tier, a counter, today's date) change.
``Variance`` keeps the first text it sees as the reference and aligns every
later text against it:

1. The common prefix and suffix are cut off by memcmp (``textdiff``), so
   only the middle, where the texts differ, is aligned.
2. The middle is cut into atoms (a run of letters or digits, one CJK
   character, a run of spaces, one other character) and aligned with
   ``difflib.SequenceMatcher`` (no junk heuristic).
3. Reference atoms that some text did not match are marked as varying.
   Runs of varying atoms are the slots; two slots separated by one space
   are one slot ("Alice Smith").

Memory is bounded: the reference is at most ``max_chars`` characters (text
beyond it is not learned), and a middle of more than ``max_atoms`` atoms is
marked varying as a whole instead of aligned.
"""

from __future__ import annotations

import re
from array import array
from bisect import bisect_right
from dataclasses import dataclass
from difflib import SequenceMatcher

from gateway.lint.textdiff import common_prefix, common_suffix

MAX_CHARS = 65536
MAX_ATOMS = 4000
CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"


class Atomizer:
    def __init__(self) -> None:
        self._atom = re.compile(rf"[{CJK}]|[^\W_{CJK}]+|\s+|.", re.DOTALL)

    def spans(self, text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
        return [m.span() for m in self._atom.finditer(text, start,
                                                       len(text) if end is None else end)]


@dataclass(frozen=True, slots=True)
class Alignment:
    """How one text maps onto the reference."""

    text: str
    atoms: list[tuple[int, int]]
    """Atom spans of the aligned part of ``text``."""
    ref_of: list[int]
    """For each atom of ``atoms``, the reference atom it matched, or -1."""
    head: int
    """Characters before the aligned part, equal in both texts."""
    tail: int
    """Characters after it, equal in both texts."""
    ref_tail_start: int
    """Offset in the reference where the common tail starts."""


class Variance:
    def __init__(self, atomizer: Atomizer, reference: str, max_chars: int = MAX_CHARS,
                 max_atoms: int = MAX_ATOMS) -> None:
        self.atomizer = atomizer
        self.reference = reference[:max_chars]
        # The reference is cut into atoms when a text that differs from it first comes
        # (``_cut``): until then nothing varies, and a group whose prompt never comes
        # back changed (a new system prompt every request: documents, a user's record)
        # never pays for cutting it. Two int arrays rather than a list of tuples: a
        # group keeps them for its lifetime.
        self.starts = array("l")
        self.ends = array("l")
        self.varying = bytearray()
        self.atomized = False
        self.max_chars = max_chars
        self.max_atoms = max_atoms
        self.seen = 1

    def _cut(self) -> None:
        spans = self.atomizer.spans(self.reference)
        self.starts = array("l", (a for a, _ in spans))
        self.ends = array("l", (b for _, b in spans))
        self.varying = bytearray(len(spans))
        self.atomized = True

    def _atom_index(self, char: int) -> int:
        """Index of the atom containing ``char`` (len(atoms) at the end)."""
        if char >= len(self.reference):
            return len(self.starts)
        return max(0, bisect_right(self.starts, char) - 1)

    def align(self, text: str) -> Alignment:
        ref = self.reference
        text = text[:self.max_chars]
        head = common_prefix(ref, text)
        if head == len(ref) == len(text):
            return Alignment(text, [], [], head, 0, len(ref))
        if not self.atomized:
            self._cut()
        count = len(self.starts)
        first = self._atom_index(head)
        head = self.starts[first] if first < count else len(ref)
        tail = common_suffix(ref, text, head)
        last = self._atom_index(len(ref) - tail) if tail else count
        if last < count and self.starts[last] < len(ref) - tail:
            last += 1  # the tail starts inside an atom: keep that atom in the middle
        ref_tail_start = self.starts[last] if last < count else len(ref)
        tail = len(ref) - ref_tail_start
        if len(text) - tail - head > self.max_atoms * 16:
            # Too long a differing middle to align: all of it counts as varying,
            # without even cutting it into atoms (that alone is O(text)).
            return Alignment(text, [], [], head, tail, ref_tail_start)
        text_atoms = self.atomizer.spans(text, head, len(text) - tail)
        ref_atoms = range(first, last)
        ref_of = [-1] * len(text_atoms)
        if len(text_atoms) <= self.max_atoms and len(ref_atoms) <= self.max_atoms:
            a = [ref[self.starts[i]:self.ends[i]] for i in ref_atoms]
            b = [text[s:e] for s, e in text_atoms]
            for block in SequenceMatcher(None, a, b, autojunk=False).get_matching_blocks():
                for k in range(block.size):
                    ref_of[block.b + k] = first + block.a + k
        return Alignment(text, text_atoms, ref_of, head, tail, ref_tail_start)

    def observe(self, text: str) -> Alignment:
        """Align ``text`` and mark the reference atoms it did not match as varying."""
        alignment = self.align(text)
        self.seen += 1
        if alignment.tail == len(self.reference) - alignment.head and not alignment.atoms:
            return alignment  # identical
        first = self._atom_index(alignment.head)
        last = self._atom_index(alignment.ref_tail_start)
        if not alignment.atoms:  # a middle too long to align: all of it varies
            self.varying[first:last] = b"\x01" * max(0, last - first)
            return alignment
        matched = {r for r in alignment.ref_of if r >= 0}
        for index in range(first, last):
            if index not in matched:
                self.varying[index] = 1
        return alignment

    def slots(self) -> list[tuple[int, int]]:
        """Character spans of the reference that vary, whitespace-trimmed and merged."""
        runs: list[list[int]] = []
        for index, flag in enumerate(self.varying):
            if not flag:
                continue
            if runs and runs[-1][1] == index:
                runs[-1][1] = index + 1
            elif (runs and runs[-1][1] == index - 1
                  and self.reference[self.starts[index - 1]:self.ends[index - 1]] == " "):
                runs[-1][1] = index + 1  # "Alice Smith": one slot across one space
            else:
                runs.append([index, index + 1])
        out = []
        for a, b in runs:
            start, end = self.starts[a], self.ends[b - 1]
            text = self.reference[start:end]
            stripped = text.strip()
            if not stripped:
                continue
            start += len(text) - len(text.lstrip())
            out.append((start, start + len(stripped)))
        return out

    def value(self, alignment: Alignment, slot: tuple[int, int]) -> tuple[int, int]:
        """The span of ``alignment``'s text that stands where the reference has ``slot``."""
        start, end = slot
        text = alignment.text
        if end <= alignment.head:
            return start, end
        if start >= alignment.ref_tail_start:
            shift = len(text) - len(self.reference)
            return start + shift, end + shift
        before = min(start, alignment.head) if start < alignment.head else alignment.head
        after = len(text) - alignment.tail
        for (s, e), ref_index in zip(alignment.atoms, alignment.ref_of):
            if ref_index < 0:
                continue
            ref_start, ref_end = self.starts[ref_index], self.ends[ref_index]
            if ref_end <= start:
                before = e
            elif ref_start >= end:
                after = s
                break
        after = max(before, after)
        piece = text[before:after]
        lead = len(piece) - len(piece.lstrip())
        return before + lead, before + lead + len(piece.strip())

    def is_stable(self, alignment: Alignment, start: int, end: int) -> bool:
        """Whether ``[start, end)`` of the aligned text lies on reference text that never varied."""
        if end <= alignment.head:
            first, last = self._atom_index(start), self._atom_index(max(start, end - 1)) + 1
        elif start >= len(alignment.text) - alignment.tail:
            shift = len(self.reference) - len(alignment.text)
            first = self._atom_index(start + shift)
            last = self._atom_index(max(start, end - 1) + shift) + 1
        else:
            refs = [r for (s, e), r in zip(alignment.atoms, alignment.ref_of) if s < end and e > start]
            if any(r < 0 for r in refs) or start < alignment.head or end > len(
                    alignment.text) - alignment.tail:
                return False
            return not any(self.varying[r] for r in refs)
        return not any(self.varying[first:last])
