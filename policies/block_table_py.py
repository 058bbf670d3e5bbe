"""The pure-Python block table: what serves when ``policies._blocktable`` is not built.

Same behaviour as the compiled table (see :mod:`policies.block_table` for the
algorithm; ``tests/unit/test_block_table.py`` compares the two on random
operations), built from dicts: block hash -> holders as a Python-int bitmask
(bit ``slot``), and per slot an ``OrderedDict`` hash -> stamp (ordered tables,
oldest first) or a dict hash -> reference count (counted tables).

Parameters: none.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

_U64 = (1 << 64) - 1


class PyBlockTable:
    __slots__ = ("_holders", "_pairs", "ordered")

    def __init__(self, ordered: bool) -> None:
        self.ordered = ordered
        self._holders: dict[int, int] = {}
        # slot -> hash -> stamp (ordered, oldest first) or reference count
        self._pairs: list[Any] = []

    # -- pairs -------------------------------------------------------------

    def _of(self, slot: int) -> Any:
        if slot < 0:
            raise ValueError("replica slot must not be negative")
        while len(self._pairs) <= slot:
            self._pairs.append(OrderedDict() if self.ordered else {})
        return self._pairs[slot]

    def _insert(self, slot: int, block_hash: int) -> None:
        self._holders[block_hash] = self._holders.get(block_hash, 0) | (1 << slot)

    def _delete(self, slot: int, block_hash: int) -> None:
        mask = self._holders[block_hash] & ~(1 << slot)
        if mask:
            self._holders[block_hash] = mask
        else:
            del self._holders[block_hash]

    def _need(self, ordered: bool) -> None:
        if self.ordered != ordered:
            raise TypeError("an ordered table's method" if ordered else "a counted table's method")

    # -- ordered -----------------------------------------------------------

    def touch(self, slot: int, hashes: Sequence[int], stamp: float, reverse: bool) -> None:
        self._need(True)
        pairs = self._of(slot)
        for block_hash in reversed(hashes) if reverse else hashes:
            block_hash &= _U64
            if block_hash in pairs:
                pairs.move_to_end(block_hash)
            else:
                self._insert(slot, block_hash)
            pairs[block_hash] = stamp

    def evict(self, slot: int, keep: int) -> int:
        self._need(True)
        pairs = self._of(slot)
        dropped = 0
        while len(pairs) > max(0, keep):
            self._delete(slot, pairs.popitem(last=False)[0])
            dropped += 1
        return dropped

    def drop_stale(self, slot: int, threshold: float, strict: bool) -> int:
        self._need(True)
        pairs = self._of(slot)
        dropped = 0
        while pairs:
            oldest = next(iter(pairs))
            stamp = pairs[oldest]
            if stamp > threshold if strict else stamp >= threshold:
                break
            del pairs[oldest]
            self._delete(slot, oldest)
            dropped += 1
        return dropped

    def stamp(self, slot: int, block_hash: int) -> float | None:
        self._need(True)
        stamp: float | None = self._of(slot).get(block_hash & _U64)
        return stamp

    # -- counted -----------------------------------------------------------

    def add(self, slot: int, block_hash: int) -> None:
        self._need(False)
        pairs = self._of(slot)
        block_hash &= _U64
        count = pairs.get(block_hash, 0)
        if not count:
            self._insert(slot, block_hash)
        pairs[block_hash] = count + 1

    def release(self, slot: int, block_hash: int) -> None:
        self._need(False)
        pairs = self._of(slot)
        block_hash &= _U64
        count = pairs.get(block_hash, 0)
        if count > 1:
            pairs[block_hash] = count - 1
        elif count:
            del pairs[block_hash]
            self._delete(slot, block_hash)

    def add_all(self, slot: int, hashes: Sequence[int]) -> None:
        for block_hash in hashes:
            self.add(slot, block_hash)

    def release_all(self, slot: int, hashes: Sequence[int]) -> int:
        self._need(False)
        pairs = self._of(slot)
        released = 0
        for block_hash in hashes:
            if pairs.get(block_hash & _U64):
                released += 1
                self.release(slot, block_hash)
        return released

    def count(self, slot: int, block_hash: int) -> int:
        self._need(False)
        count: int = self._of(slot).get(block_hash & _U64, 0)
        return count

    # -- both --------------------------------------------------------------

    def discard(self, slot: int, hashes: Sequence[int]) -> None:
        pairs = self._of(slot)
        for block_hash in hashes:
            block_hash &= _U64
            if pairs.pop(block_hash, None) is not None:
                self._delete(slot, block_hash)

    def clear(self, slot: int) -> None:
        pairs = self._of(slot)
        for block_hash in pairs:
            self._delete(slot, block_hash)
        pairs.clear()

    def size(self, slot: int) -> int:
        if slot < 0:
            raise ValueError("replica slot must not be negative")
        return len(self._pairs[slot]) if slot < len(self._pairs) else 0

    def _fresh(self, slot: int, block_hash: int, threshold: float, strict: bool) -> bool:
        stamp = self._pairs[slot].get(block_hash)
        return stamp is not None and (stamp > threshold if strict else stamp >= threshold)

    def match(self, hashes: Sequence[int], ids: list[str], threshold: float, strict: bool,
              speculative: Any = None, /) -> dict[str, int]:
        """See :mod:`policies.block_table`: one walk, then freshness per matching replica."""
        if speculative is not None and not isinstance(speculative, PyBlockTable):
            raise TypeError("speculative must be a PyBlockTable")
        if speculative is not None and (self.ordered or not speculative.ordered):
            raise TypeError("match(speculative=...) needs a counted table and an ordered one")
        keys = [block_hash & _U64 for block_hash in hashes]
        if not keys:
            return {}
        get = self._holders.get
        speculative_get = speculative._holders.get if speculative is not None else None
        alive = get(keys[0], 0)
        last_speculative: dict[int, int] = {}
        if speculative_get is not None:
            confirmed = alive
            alive |= speculative_get(keys[0], 0)
            for slot in _bits(alive & ~confirmed):
                last_speculative[slot] = 0
        raw: dict[int, int] = {}
        position = 1
        while alive and position < len(keys):
            hold = get(keys[position], 0)
            if speculative_get is not None:
                confirmed = hold
                hold |= speculative_get(keys[position], 0)
            for slot in _bits(alive & ~hold):
                raw[slot] = position
            alive &= hold
            if speculative_get is not None:
                for slot in _bits(alive & ~confirmed):
                    last_speculative[slot] = position
            position += 1
        for slot in _bits(alive):
            raw[slot] = len(keys)
        matched: dict[str, int] = {}
        for slot, run in raw.items():
            if self.ordered and not self._fresh(slot, keys[run - 1], threshold, strict):
                low, high = 0, run - 1
                while low < high:
                    middle = (low + high + 1) // 2
                    if self._fresh(slot, keys[middle - 1], threshold, strict):
                        low = middle
                    else:
                        high = middle - 1
                run = low
            elif speculative is not None and slot in last_speculative and not speculative._fresh(
                slot, keys[last_speculative[slot]], threshold, strict
            ):
                confirmed_pairs = self._pairs[slot] if slot < len(self._pairs) else {}
                walked = 0
                while walked < run and (
                    keys[walked] in confirmed_pairs
                    or speculative._fresh(slot, keys[walked], threshold, strict)
                ):
                    walked += 1
                run = walked
            if run:
                matched[ids[slot]] = run
        return matched


def _bits(mask: int) -> list[int]:
    """The set bits of a mask, lowest first."""
    bits = []
    while mask:
        low = mask & -mask
        bits.append(low.bit_length() - 1)
        mask ^= low
    return bits
