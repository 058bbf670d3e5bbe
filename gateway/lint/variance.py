"""Learn which spans of a templated text vary between requests (the part regex cannot do).

An app builds its system prompt from a template: most of the text is fixed,
a few slots (the user's name, their tier, a counter, today's date) change.
``Variance`` keeps the first text it sees as the reference and aligns every
later text against it:

1. The common prefix and suffix are cut off by memcmp (``textdiff``), so
   only the middle, where the texts differ, is aligned.
2. The middle is cut into atoms (a run of letters or digits, one CJK
   character, a run of spaces, one other character) and aligned with
   ``difflib.SequenceMatcher`` (no junk heuristic, but for middles longer than
   ``EXACT_ATOMS``).
3. Reference atoms that some text did not match are marked as varying, and
   so are the gaps between reference atoms where some text has atoms the
   reference lacks (an insertion: "pro" and "enterprise pro"). Runs of
   varying atoms are the slots; two slots separated by one space are one
   slot ("Alice Smith"). A gap next to no varying atom is an empty slot of
   its own (where another text has "enterprise " before "pro", or a space);
   ``grown`` takes the next word into it, for a value in every text.

The common prefix and suffix end on atom boundaries of both texts: "gold"
and "golden" share "gold", but differ in one atom, not by an insertion of
"en" after a "gold" both have.

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
EXACT_ATOMS = 400
"""Middles of up to this many atoms a side are aligned exactly; longer ones (a document
pasted into each request's prompt) with ``SequenceMatcher``'s junk heuristic, which
stops it comparing every space and comma of one side with every one of the other:
exact, two such middles of 2,400 atoms took 0.9 s, the heuristic a few ms. Where the
texts differ over thousands of atoms what varies is all of it; which spaces in
between match does not change what the linter says."""
CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"


class Atomizer:
    def __init__(self) -> None:
        self._atom = re.compile(rf"[{CJK}]|[^\W_{CJK}]+|\s+|.", re.DOTALL)
        self._joined = re.compile(rf"[^\W_{CJK}]{{2}}|\s{{2}}")

    def is_boundary(self, text: str, position: int) -> bool:
        """Whether an atom of ``text`` starts (or ends) at ``position``: no run of letters
        or digits, nor of spaces, goes on across it."""
        if position <= 0 or position >= len(text):
            return True
        return self._joined.match(text, position - 1, position + 1) is None

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
        self.inserted = bytearray()
        """Per gap before reference atom i (and one after the last): some text had atoms
        there that the reference lacks."""
        self.atomized = False
        self.max_chars = max_chars
        self.max_atoms = max_atoms
        self.seen = 1

    def _cut(self) -> None:
        spans = self.atomizer.spans(self.reference)
        self.starts = array("l", (a for a, _ in spans))
        self.ends = array("l", (b for _, b in spans))
        self.varying = bytearray(len(spans))
        self.inserted = bytearray(len(spans) + 1)
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
        if head and not self.atomizer.is_boundary(text, head):
            # "gold" and "golden": the text's atom goes on past the common prefix, so
            # the reference atom that ends there is in the middle too (else only "en"
            # would differ, an insertion after a "gold" both have).
            first = self._atom_index(head - 1)
            head = self.starts[first]
        tail = common_suffix(ref, text, head)
        last = self._atom_index(len(ref) - tail) if tail else count
        if last < count and self.starts[last] < len(ref) - tail:
            last += 1  # the tail starts inside an atom: keep that atom in the middle
        if (last < count and tail
                and not self.atomizer.is_boundary(text, len(text) - (len(ref) - self.starts[last]))):
            last += 1  # "4821" and "14821": the same on the text's side
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
            exact = len(a) <= EXACT_ATOMS and len(b) <= EXACT_ATOMS
            for block in SequenceMatcher(None, a, b, autojunk=not exact).get_matching_blocks():
                for k in range(block.size):
                    ref_of[block.b + k] = first + block.a + k
        return Alignment(text, text_atoms, ref_of, head, tail, ref_tail_start)

    def observe(self, text: str) -> Alignment:
        """Align ``text`` and mark the reference atoms it did not match as varying, and the
        gaps where it has atoms the reference lacks as inserted."""
        alignment = self.align(text)
        self.seen += 1
        if (len(alignment.text) == len(self.reference)
                and alignment.head + alignment.tail == len(self.reference)):
            return alignment  # identical
        first = self._atom_index(alignment.head)
        last = self._atom_index(alignment.ref_tail_start)
        if not alignment.atoms:  # a middle too long to align (or empty): all of it varies
            self.varying[first:last] = b"\x01" * max(0, last - first)
            if last == first and len(alignment.text) != len(self.reference):
                self.inserted[first] = 1
            return alignment
        matched = {r for r in alignment.ref_of if r >= 0}
        for index in range(first, last):
            if index not in matched:
                self.varying[index] = 1
        gap = first  # the reference atom the next text atom would stand before
        for ref_index in alignment.ref_of:
            if ref_index >= 0:
                gap = ref_index + 1
            else:
                self.inserted[gap] = 1
        return alignment

    def slots(self) -> list[tuple[int, int]]:
        """Character spans of the reference that vary, whitespace-trimmed and merged (a span
        of spaces alone where only spaces vary); an empty span where some text has more
        between two reference atoms."""
        count = len(self.varying)
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
                out.append((start, end))  # only spaces differ: "\n" and "\r\n"
                continue
            start += len(text) - len(text.lstrip())
            out.append((start, start + len(stripped)))
        for gap, flag in enumerate(self.inserted):
            if not flag or (gap < count and self.varying[gap]) or (
                    gap > 0 and self.varying[gap - 1]):
                continue  # next to a varying atom: that slot holds the insertion
            at = self.starts[gap] if gap < count else len(self.reference)
            out.append((at, at))  # "" where another text has "enterprise " (or a space)
        out.sort()
        merged: list[tuple[int, int]] = []
        for start, end in out:
            if merged and start < merged[-1][1]:
                merged[-1] = (merged[-1][0], max(merged[-1][1], end))
            elif not merged or (start, end) != merged[-1]:
                merged.append((start, end))
        return merged

    def value(self, alignment: Alignment, slot: tuple[int, int]) -> tuple[int, int]:
        """The span of ``alignment``'s text that stands where the reference has ``slot``:
        from the end of the last reference text it matched before the slot to the start of
        the first it matched after."""
        start, end = slot
        text = alignment.text
        shift = len(text) - len(self.reference)
        middle_end = len(text) - alignment.tail
        if start <= alignment.head:
            before = start
        elif start > alignment.ref_tail_start:
            before = start + shift
        else:
            before = alignment.head
            for (_, e), ref_index in zip(alignment.atoms, alignment.ref_of):
                if ref_index >= 0 and self.ends[ref_index] <= start:
                    before = e
        if end >= alignment.ref_tail_start:
            after = end + shift
        elif end < alignment.head:
            after = end
        else:
            after = middle_end
            for (s, _), ref_index in zip(alignment.atoms, alignment.ref_of):
                if ref_index >= 0 and self.starts[ref_index] >= end:
                    after = s
                    break
        after = max(before, after)
        piece = text[before:after]
        if not piece.strip() and not self.reference[start:end].strip():
            return before, after  # spaces where the reference has spaces, or nothing
        lead = len(piece) - len(piece.lstrip())
        return before + lead, before + lead + len(piece.strip())

    def grown(self, slot: tuple[int, int]) -> tuple[int, int]:
        """``slot`` with the next reference word taken in (the one before, at the end): where
        some text has nothing in its place ("pro" and "enterprise pro": "enterprise" is
        missing from one), so that every text shows a value there."""
        start, end = slot
        if not self.atomized:
            return slot
        count = len(self.starts)
        index = self._atom_index(end)
        if index < count and self.starts[index] < end:
            index += 1
        while index < count and self.reference[self.starts[index]:self.ends[index]].isspace():
            index += 1
        if index < count:
            return start, self.ends[index]
        index = self._atom_index(start - 1) if start else -1
        while index >= 0 and self.reference[self.starts[index]:self.ends[index]].isspace():
            index -= 1
        return (self.starts[index], end) if index >= 0 else slot

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
            if not refs:
                return True
            first, last = min(refs), max(refs) + 1
        # an insertion before one of its atoms varies it too ("pro", "enterprise pro")
        return not any(self.varying[first:last]) and not any(self.inserted[first:last])
