"""The block table both prefix indexes are built on: one map from block hash to holders.

Algorithm: instead of one set of blocks per replica (a decision then asks every
replica, O(replicas x log blocks)), one table maps each block hash to the set of
replicas holding it, and each (hash, replica) pair carries a value:

* *ordered* tables (the approximate index, the precise index's speculation):
  the pairs of each replica form an LRU list, oldest first, each with a
  ``stamp`` (a time: when it was touched, or when it expires). ``touch``
  moves pairs to the newest end, ``evict`` drops the oldest beyond a count,
  ``drop_stale`` drops the oldest while they are not fresh.
* *counted* tables (the precise index's confirmed blocks): the value is a
  reference count (``add`` / ``release``, or a whole prompt's blocks at once with
  ``add_all`` / ``release_all``: the pending-prefix index, ``policies.pending``).

``match`` walks a prompt's hashes once from the first block, intersecting
holder sets: a replica's leading run ends at the block where it drops out, and
the walk stops when no replica is left. Replicas holding nothing of the prompt
cost nothing; a decision costs O(matched blocks) lookups plus, per matching
replica, one freshness check. Freshness is ``stamp >= threshold`` (or ``>``
with ``strict``). Chain hashes make it monotone: a held block's prefix was
touched no earlier (``record`` touches a prompt's blocks last to first,
speculation stamps a prompt's blocks alike), so when a run's last block is
fresh the whole run is; otherwise an ordered table binary-searches the fresh
run and a counted table with speculation (``match(..., speculative=...)``:
confirmed blocks, or speculated ones that are fresh) walks that replica's run.

Replicas are small integer *slots* (:class:`ReplicaSlots` maps their ids, at
most 4096 per index); ``match`` returns ``{ids[slot]: leading blocks}``. Hashes are taken modulo
2**64 (the gateway's are xxh3 64-bit values already).

Two implementations with one behaviour: the compiled ``policies._blocktable``
(built by ``pip install -e .`` from ``policies/_blocktable.c``: 16-byte hash
slots holding a single holder inline, replica bitmasks for shared blocks, LRU
lists in flat arrays; 50-57 bytes per indexed block, traced by tracemalloc)
and :class:`policies.block_table_py.PyBlockTable`, used when the extension is
not built (dicts and Python-int bitmasks: about 210 bytes per block, and a
long match walks in Python, some 20x slower). Figures: BENCHMARKS.md,
"Routing at fleet scale".
``tests/unit/test_block_table.py`` runs both against each other.

Parameters: none; capacities and TTLs are the indexes' (``policies.prefix_index``,
``policies.precise_index``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from typing import Protocol

from policies.block_table_py import PyBlockTable

try:
    from policies._blocktable import MAX_SLOTS as _COMPILED_MAX_SLOTS
    from policies._blocktable import BlockTable as _CompiledBlockTable
except ImportError:  # the extension was not built: the pure-Python table serves
    _CompiledBlockTable = None
    _COMPILED_MAX_SLOTS = 0


class BlockTable(Protocol):
    @property
    def ordered(self) -> bool: ...

    def touch(self, slot: int, hashes: Sequence[int], stamp: float, reverse: bool) -> None: ...

    def evict(self, slot: int, keep: int) -> int: ...

    def drop_stale(self, slot: int, threshold: float, strict: bool) -> int: ...

    def stamp(self, slot: int, block_hash: int) -> float | None: ...

    def add(self, slot: int, block_hash: int) -> None: ...

    def release(self, slot: int, block_hash: int) -> None: ...

    def add_all(self, slot: int, hashes: Sequence[int]) -> None: ...

    def release_all(self, slot: int, hashes: Sequence[int]) -> int: ...

    def count(self, slot: int, block_hash: int) -> int: ...

    def discard(self, slot: int, hashes: Sequence[int]) -> None: ...

    def clear(self, slot: int) -> None: ...

    def size(self, slot: int) -> int: ...

    def match(self, hashes: Sequence[int], ids: list[str], threshold: float, strict: bool,
              speculative: BlockTable | None = None, /) -> dict[str, int]: ...


BlockTableFactory = Callable[[bool], BlockTable]
"""``factory(ordered)``: a new, empty table."""


def python_tables(ordered: bool) -> BlockTable:
    return PyBlockTable(ordered)


def compiled_available() -> bool:
    return _CompiledBlockTable is not None


def compiled_tables(ordered: bool) -> BlockTable:
    if _CompiledBlockTable is None:
        raise RuntimeError("policies._blocktable is not built: run `pip install -e .`")
    table: BlockTable = _CompiledBlockTable(ordered)
    return table


def default_tables(ordered: bool) -> BlockTable:
    """The compiled table when it is built, else the pure-Python one."""
    return compiled_tables(ordered) if _CompiledBlockTable is not None else python_tables(ordered)


def default_backend() -> str:
    """``compiled`` or ``python``: what ``default_tables`` builds. The gateway reports it
    (start-up log, ``/ready``, ``prefixgate_block_table_info``); policies only name it."""
    return "compiled" if _CompiledBlockTable is not None else "python"


def backend_name(factory: BlockTableFactory) -> str:
    """``compiled`` or ``python``: what a factory's tables are (for reports)."""
    return "python" if isinstance(factory(True), PyBlockTable) else "compiled"


class ReplicaSlots:
    """Replica ids <-> small slot numbers; a freed slot is reused (lowest first)."""

    def __init__(self, max_slots: int | None = None) -> None:
        self.max_slots = max_slots or (_COMPILED_MAX_SLOTS or 4096)
        self.ids: list[str] = []
        """``ids[slot]``: the replica in that slot ("" when free); ``match`` reads it."""
        self._slot: dict[str, int] = {}
        self._free: list[int] = []

    def get(self, replica_id: str) -> int | None:
        return self._slot.get(replica_id)

    def slot(self, replica_id: str) -> int:
        """The replica's slot, taking one if it has none."""
        slot = self._slot.get(replica_id)
        if slot is not None:
            return slot
        if self._free:
            slot = heapq.heappop(self._free)
            self.ids[slot] = replica_id
        else:
            if len(self.ids) >= self.max_slots:
                raise ValueError(f"at most {self.max_slots} replicas per index")
            slot = len(self.ids)
            self.ids.append(replica_id)
        self._slot[replica_id] = slot
        return slot

    def release(self, replica_id: str) -> int | None:
        """Free the replica's slot; returns it (None if it had none)."""
        slot = self._slot.pop(replica_id, None)
        if slot is not None:
            self.ids[slot] = ""
            heapq.heappush(self._free, slot)
        return slot

    def replicas(self) -> list[str]:
        return sorted(self._slot)

    def items(self) -> list[tuple[str, int]]:
        return list(self._slot.items())
