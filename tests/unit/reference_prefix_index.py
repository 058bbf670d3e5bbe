"""Reference for the property tests: policies.prefix_index as it was before
the block table (commit 9a5099c): one dict per replica, ApproximatePrefixIndex unchanged.

The approximate prefix index: which blocks the gateway has sent where.

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

``match`` never mutates: a decision can be replayed. It binary-searches the
leading run instead of walking it: a block's hash is chained to all blocks
before it, ``record`` touches a prompt's blocks last to first, and eviction
and staleness go strictly by touch order, so whenever a block is held all
blocks before it are held and fresher. Holding block ``i`` therefore means
holding blocks ``0..i``, and "held" is monotone along the prompt. Cost:
``match`` is O(log blocks) dictionary lookups per replica (O(matched blocks)
for a replica after :meth:`remove`, which can punch holes), ``record``
O(blocks) plus amortised O(1) per eviction; memory is bounded by the sum of
capacities.

Parameters:

* ``ttl_seconds`` (default 300.0): an entry untouched this long is stale.
* ``default_capacity_blocks`` (default 8192): capacity of a replica whose
  real capacity is not known yet.
* ``max_capacity_blocks`` (default 1_048_576): upper clamp on any capacity,
  a memory guard against a wrong scrape.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence


class ApproximatePrefixIndex:
    def __init__(
        self,
        *,
        ttl_seconds: float = 300.0,
        default_capacity_blocks: int = 8192,
        max_capacity_blocks: int = 1_048_576,
    ) -> None:
        if ttl_seconds <= 0:
            raise ValueError("ttl_seconds must be positive")
        if default_capacity_blocks <= 0 or max_capacity_blocks <= 0:
            raise ValueError("capacities must be positive")
        self.ttl_seconds = ttl_seconds
        self.default_capacity_blocks = min(default_capacity_blocks, max_capacity_blocks)
        self.max_capacity_blocks = max_capacity_blocks
        # replica -> block hash -> last time it was touched; oldest first.
        self._entries: dict[str, OrderedDict[int, float]] = {}
        self._capacity: dict[str, int] = {}
        # Replicas whose entries may have holes (after ``remove``): walked, not searched.
        self._holes: set[str] = set()

    # -- capacity ---------------------------------------------------------

    def set_capacity(self, replica_id: str, blocks: int) -> None:
        """Size a replica's entry set by its KV capacity; evicts LRU if it shrank."""
        if blocks <= 0:
            raise ValueError("capacity must be positive")
        self._capacity[replica_id] = min(blocks, self.max_capacity_blocks)
        entries = self._entries.get(replica_id)
        if entries is not None:
            self._evict_to_capacity(replica_id, entries)

    def capacity(self, replica_id: str) -> int:
        return self._capacity.get(replica_id, self.default_capacity_blocks)

    # -- learning ---------------------------------------------------------

    def record(self, replica_id: str, block_hashes: Sequence[int], now: float) -> None:
        """The gateway sent a prompt with these blocks to ``replica_id`` at ``now``."""
        entries = self._entries.get(replica_id)
        if entries is None:
            entries = self._entries[replica_id] = OrderedDict()
        move_to_end = entries.move_to_end
        # Last block first, so the shared prefix ends up most recently used.
        for block_hash in reversed(block_hashes):
            entries[block_hash] = now
            move_to_end(block_hash)
        self._evict_to_capacity(replica_id, entries)
        self._drop_stale(entries, now)

    def remove(self, replica_id: str, block_hashes: Iterable[int]) -> None:
        """Forget specific blocks of a replica (e.g. the engine reported them gone)."""
        entries = self._entries.get(replica_id)
        if entries is None:
            return
        self._holes.add(replica_id)
        for block_hash in block_hashes:
            entries.pop(block_hash, None)

    def clear(self, replica_id: str) -> None:
        """Forget everything about a replica's cache (capacity is kept)."""
        self._entries.pop(replica_id, None)
        self._holes.discard(replica_id)

    def forget_replica(self, replica_id: str) -> None:
        """The ``PrefixIndex`` name of :meth:`clear`."""
        self.clear(replica_id)

    def expire(self, now: float) -> int:
        """Drop stale entries of every replica; returns how many were dropped."""
        return sum(self._drop_stale(entries, now) for entries in self._entries.values())

    # -- queries ----------------------------------------------------------

    def match(self, block_hashes: Sequence[int], now: float) -> dict[str, int]:
        """Leading blocks of the prompt each replica is believed to hold.

        Replicas holding none of it are left out. Stale entries do not count.
        """
        cutoff = now - self.ttl_seconds
        matched: dict[str, int] = {}
        for replica_id, entries in self._entries.items():
            get = entries.get
            if replica_id in self._holes:
                run = 0
                for block_hash in block_hashes:
                    touched = get(block_hash)
                    if touched is None or touched < cutoff:
                        break
                    run += 1  # noqa: SIM113 (stops at the first miss)
            else:
                # The largest run whose last block is held and fresh (monotone, see above).
                run, high = 0, len(block_hashes)
                while run < high:
                    middle = (run + high + 1) // 2
                    touched = get(block_hashes[middle - 1])
                    if touched is None or touched < cutoff:
                        high = middle - 1
                    else:
                        run = middle
            if run:
                matched[replica_id] = run
        return matched

    def size(self, replica_id: str) -> int:
        """Blocks currently held for a replica (stale ones included until dropped)."""
        entries = self._entries.get(replica_id)
        return 0 if entries is None else len(entries)

    def replicas(self) -> list[str]:
        return sorted(self._entries)

    def contains(self, replica_id: str, block_hash: int, now: float) -> bool:
        entries = self._entries.get(replica_id)
        if entries is None:
            return False
        touched = entries.get(block_hash)
        return touched is not None and touched >= now - self.ttl_seconds

    # -- internals --------------------------------------------------------

    def _evict_to_capacity(self, replica_id: str, entries: OrderedDict[int, float]) -> None:
        excess = len(entries) - self.capacity(replica_id)
        for _ in range(max(0, excess)):
            entries.popitem(last=False)

    def _drop_stale(self, entries: OrderedDict[int, float], now: float) -> int:
        cutoff = now - self.ttl_seconds
        dropped = 0
        # Oldest first: stop at the first fresh entry. (With a monotonic clock
        # the order is by touch time; an out-of-order ``now`` only delays drops.)
        while entries:
            oldest_hash = next(iter(entries))
            if entries[oldest_hash] >= cutoff:
                break
            del entries[oldest_hash]
            dropped += 1
        return dropped
