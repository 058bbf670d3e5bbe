"""The one least-recently-used map of the project.

Bounded by total weight (each entry's weight is 1 unless given, so by
default by entry count) and, optionally, by total bytes (``max_bytes``:
each entry's ``size`` as its caller estimates it, 0 unless given): ``put``
adds or replaces an entry as the most recent and evicts the least recent
ones until both totals fit, returning what it evicted so a caller can clean
up after them. The newest entry is never evicted by its own ``put``, even
when it alone outweighs a bound. ``get`` touches an entry; ``peek`` reads
without touching, so it does not reorder the map (safe beside a writer on
another thread under the GIL).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    def __init__(self, capacity: int, max_bytes: int | None = None) -> None:
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.weight = 0
        self.bytes = 0
        """The sum of the entries' ``size`` (what ``max_bytes`` bounds)."""
        self._data: OrderedDict[K, tuple[V, int, int]] = OrderedDict()

    def get(self, key: K) -> V | None:
        entry = self._data.get(key)
        if entry is None:
            return None
        self._data.move_to_end(key)
        return entry[0]

    def peek(self, key: K) -> V | None:
        entry = self._data.get(key)
        return None if entry is None else entry[0]

    def put(self, key: K, value: V, weight: int = 1, size: int = 0) -> list[tuple[K, V]]:
        """Add or replace ``key`` as the most recent; returns the evicted entries."""
        self._drop(self._data.pop(key, None))
        self._data[key] = (value, weight, size)
        self.weight += weight
        self.bytes += size
        return self._evict()

    def pop(self, key: K) -> V | None:
        entry = self._data.pop(key, None)
        self._drop(entry)
        return None if entry is None else entry[0]

    def _drop(self, entry: tuple[V, int, int] | None) -> None:
        if entry is not None:
            self.weight -= entry[1]
            self.bytes -= entry[2]

    def clear(self) -> None:
        self._data.clear()
        self.weight = self.bytes = 0

    def oldest(self) -> tuple[K, V] | None:
        for key, (value, _, _) in self._data.items():
            return key, value
        return None

    def resize(self, capacity: int, max_bytes: int | None = None) -> list[tuple[K, V]]:
        self.capacity = capacity
        if max_bytes is not None:
            self.max_bytes = max_bytes
        return self._evict()

    def _over(self) -> bool:
        return self.weight > self.capacity or (
            self.max_bytes is not None and self.bytes > self.max_bytes)

    def _evict(self) -> list[tuple[K, V]]:
        evicted: list[tuple[K, V]] = []
        while self._over() and len(self._data) > 1:
            key, entry = self._data.popitem(last=False)
            self._drop(entry)
            evicted.append((key, entry[0]))
        return evicted

    def items(self) -> Iterator[tuple[K, V]]:
        """Oldest first."""
        for key, (value, _, _) in self._data.items():
            yield key, value

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data
