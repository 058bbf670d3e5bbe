"""The approximate prefix index: which blocks the gateway has sent where.

Algorithm: the gateway cannot see inside a replica's KV cache, so it keeps a
model of each replica's cache learned from its own routing. After a request
is routed, :meth:`ApproximatePrefixIndex.record` adds the request's chained
block hashes to that replica's entry set; :meth:`match` walks a new prompt's
hashes from the first block and reports, per replica, the length of the
longest *leading* run it holds. Chain hashes make a held block ``i`` imply its
whole prefix, so the walk stops at the first block a replica lacks.

Each replica's entry set mirrors how vLLM manages its prefix cache:

* Sized by the replica's real KV capacity in blocks (:meth:`set_capacity`),
  so the model forgets roughly when the engine does.
* Least-recently-used eviction. A recorded request touches its blocks from
  the *last* to the first, so the shared leading blocks are the freshest and
  a request's unique tail is evicted first, as vLLM frees a finished
  request's blocks tail-first.
* Entries not touched for ``ttl_seconds`` are stale: :meth:`match` ignores
  them at once and :meth:`record` drops them. This covers what the model
  cannot see (other clients of the replica, restarts, preemption).

``match`` never mutates: a decision can be replayed. Storage is one
:mod:`policies.block_table` for all replicas (block hash -> the replicas
holding it, and per replica an LRU list with each block's last touch), so
``match`` walks the prompt's hashes once, intersecting holder sets, and costs
O(matched blocks) lookups plus one freshness check per *matching* replica:
replicas holding nothing of the prompt cost nothing. Freshness is monotone
along a chain: a block's hash is chained to all blocks before it, ``record``
touches a prompt's blocks last to first, and eviction and staleness go
strictly by touch order, so whenever a block is held all blocks before it
are held and fresher; when a run's last block is stale the fresh run is
binary-searched inside it. ``remove`` can punch holes; the walk sees them
exactly. ``record`` is O(blocks) plus amortised O(1) per eviction; memory is
bounded by the sum of capacities (about 50-57 bytes per block with the
compiled table, see :mod:`policies.block_table`).

Parameters:

* ``ttl_seconds`` (default 300.0): an entry untouched this long is stale.
* ``default_capacity_blocks`` (default 8192): capacity of a replica whose
  real capacity is not known yet.
* ``max_capacity_blocks`` (default 1_048_576): upper clamp on any capacity,
  a memory guard against a wrong scrape.
* ``table_factory`` (default: the compiled table when built): where the
  blocks are stored (:mod:`policies.block_table`; tests pass each one).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from policies.block_table import BlockTableFactory, ReplicaSlots, default_tables


class ApproximatePrefixIndex:
    def __init__(
        self,
        *,
        ttl_seconds: float = 300.0,
        default_capacity_blocks: int = 8192,
        max_capacity_blocks: int = 1_048_576,
        table_factory: BlockTableFactory = default_tables,
    ) -> None:
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        if default_capacity_blocks <= 0 or max_capacity_blocks <= 0:
            raise ValueError("capacities must be positive")
        self.ttl_seconds = ttl_seconds
        self.default_capacity_blocks = min(default_capacity_blocks, max_capacity_blocks)
        self.max_capacity_blocks = max_capacity_blocks
        # block hash -> replicas holding it; per replica an LRU list of last touches
        self._table = table_factory(True)
        # a replica has a slot from its first record until it is cleared
        self._slots = ReplicaSlots()
        self._capacity: dict[str, int] = {}

    # -- capacity ---------------------------------------------------------

    def set_capacity(self, replica_id: str, blocks: int) -> None:
        """Size a replica's entry set by its KV capacity; evicts LRU if it shrank."""
        if blocks <= 0:
            raise ValueError("capacity must be positive")
        self._capacity[replica_id] = min(blocks, self.max_capacity_blocks)
        slot = self._slots.get(replica_id)
        if slot is not None:
            self._table.evict(slot, self._capacity[replica_id])

    def capacity(self, replica_id: str) -> int:
        return self._capacity.get(replica_id, self.default_capacity_blocks)

    # -- learning ---------------------------------------------------------

    def record(self, replica_id: str, block_hashes: Sequence[int], now: float) -> None:
        """The gateway sent a prompt with these blocks to ``replica_id`` at ``now``."""
        slot = self._slots.slot(replica_id)
        table = self._table
        # Last block first, so the shared prefix ends up most recently used.
        table.touch(slot, block_hashes, now, True)
        table.evict(slot, self.capacity(replica_id))
        table.drop_stale(slot, now - self.ttl_seconds, False)

    def remove(self, replica_id: str, block_hashes: Iterable[int]) -> None:
        """Forget specific blocks of a replica (e.g. the engine reported them gone)."""
        slot = self._slots.get(replica_id)
        if slot is not None:
            self._table.discard(slot, list(block_hashes))

    def clear(self, replica_id: str) -> None:
        """Forget everything about a replica's cache (capacity is kept)."""
        slot = self._slots.release(replica_id)
        if slot is not None:
            self._table.clear(slot)

    def forget_replica(self, replica_id: str) -> None:
        """The ``PrefixIndex`` name of :meth:`clear`."""
        self.clear(replica_id)

    def expire(self, now: float) -> int:
        """Drop stale entries of every replica; returns how many were dropped."""
        cutoff = now - self.ttl_seconds
        return sum(self._table.drop_stale(slot, cutoff, False) for _, slot in self._slots.items())

    # -- queries ----------------------------------------------------------

    def match(self, block_hashes: Sequence[int], now: float) -> dict[str, int]:
        """Leading blocks of the prompt each replica is believed to hold.

        Replicas holding none of it are left out. Stale entries do not count.
        """
        return self._table.match(block_hashes, self._slots.ids, now - self.ttl_seconds, False)

    def size(self, replica_id: str) -> int:
        """Blocks currently held for a replica (stale ones included until dropped)."""
        slot = self._slots.get(replica_id)
        return 0 if slot is None else self._table.size(slot)

    def replicas(self) -> list[str]:
        return self._slots.replicas()

    def contains(self, replica_id: str, block_hash: int, now: float) -> bool:
        slot = self._slots.get(replica_id)
        if slot is None:
            return False
        touched = self._table.stamp(slot, block_hash)
        return touched is not None and touched >= now - self.ttl_seconds
