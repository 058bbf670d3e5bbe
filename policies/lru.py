"""The one least-recently-used map of the project.

Bounded by total weight (each entry's weight is 1 unless given, so by
default by entry count): ``put`` adds or replaces an entry as the most
recent and evicts the least recent ones until the total fits, returning
what it evicted so a caller can clean up after them. The newest entry is
never evicted by its own ``put``, even when it alone outweighs the capacity.
``get`` touches an entry; ``peek`` reads without touching, so it does not
reorder the map (safe beside a writer on another thread under the GIL).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class LRU(Generic[K, V]):
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.weight = 0
        self._data: OrderedDict[K, tuple[V, int]] = OrderedDict()

    def get(self, key: K) -> V | None:
        entry = self._data.get(key)
        if entry is None:
            return None
        self._data.move_to_end(key)
        return entry[0]

    def peek(self, key: K) -> V | None:
        entry = self._data.get(key)
        return None if entry is None else entry[0]

    def put(self, key: K, value: V, weight: int = 1) -> list[tuple[K, V]]:
        """Add or replace ``key`` as the most recent; returns the evicted entries."""
        old = self._data.pop(key, None)
        if old is not None:
            self.weight -= old[1]
        self._data[key] = (value, weight)
        self.weight += weight
        return self._evict()

    def pop(self, key: K) -> V | None:
        entry = self._data.pop(key, None)
        if entry is None:
            return None
        self.weight -= entry[1]
        return entry[0]

    def oldest(self) -> tuple[K, V] | None:
        for key, (value, _) in self._data.items():
            return key, value
        return None

    def resize(self, capacity: int) -> list[tuple[K, V]]:
        self.capacity = capacity
        return self._evict()

    def _evict(self) -> list[tuple[K, V]]:
        evicted: list[tuple[K, V]] = []
        while self.weight > self.capacity and len(self._data) > 1:
            key, (value, weight) = self._data.popitem(last=False)
            self.weight -= weight
            evicted.append((key, value))
        return evicted

    def items(self) -> Iterator[tuple[K, V]]:
        """Oldest first."""
        for key, (value, _) in self._data.items():
            yield key, value

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data
