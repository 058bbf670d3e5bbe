"""Prefixes on their way: the blocks of requests sent to a replica and not yet prefilled.

Algorithm: from the moment the gateway sends a request to a replica, that
replica is going to hold the request's prompt blocks: the engine registers
a prompt's full blocks in its prefix cache as it schedules their prefill, so
a second request with the same prefix that reaches the same engine while
the first is still queued or prefilling is served those blocks (vLLM and the
simulator both do). An index that learns a prompt only once it is answered
cannot see this: a burst of requests with one new prefix, all decided in the
same millisecond, finds every replica empty.

:class:`PendingPrefixes` is the index of those blocks in flight. ``add``
when a request is sent to a replica; ``discard`` when that request's
prefill is confirmed (its first token: the blocks then belong to the cache
index, which records them) or when it failed or was aborted first (the
blocks never arrive, or are about to be freed). ``match`` reports, per
replica, how many leading blocks of a prompt are on their way there, the
same shape as a cache index's match, so the policy takes the larger of the
two per replica.

What a pending prefix costs is not this module's concern: the replica's
outstanding prefill (``ReplicaView.pending_prefill_tokens``) is what a
request queued behind it waits for, and the scorer weighs it against paying
the prefill elsewhere (:mod:`policies.cost_scorer`).

Storage: a counted block table (``policies.block_table``), the structure
the precise index keeps its confirmed blocks in: each (block, replica) pair
holds the number of requests in flight carrying that block. Chained hashes
make a held block imply its whole prefix, so a replica's pending blocks are
closed under prefixes and ``match`` is the table's one walk from the first
block. ``add`` and ``discard`` are one call each, whatever the prompt's
length (the compiled table takes the whole list; the pure-Python one, used
when the extension is not built, loops). Memory is bounded by the requests
in flight: every ``add`` is followed by its ``discard`` (the gateway's lease
on the request guarantees it), even when the replica left rotation
meanwhile; a replica with nothing pending gives its slot back.
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.block_table import BlockTableFactory, ReplicaSlots, default_tables


class PendingPrefixes:
    def __init__(self, tables: BlockTableFactory = default_tables) -> None:
        self._table = tables(False)
        self._slots = ReplicaSlots()
        self._blocks: dict[str, int] = {}
        """Per replica, the pending (block, request) pairs: a size for the ops view."""

    def add(self, replica_id: str, block_hashes: Sequence[int]) -> None:
        """A request holding ``block_hashes`` was sent to ``replica_id``."""
        if not block_hashes:
            return
        self._table.add_all(self._slots.slot(replica_id), block_hashes)
        self._blocks[replica_id] = self._blocks.get(replica_id, 0) + len(block_hashes)

    def discard(self, replica_id: str, block_hashes: Sequence[int]) -> None:
        """That request's prefill is confirmed, or it will never happen. Discarding
        what was not added (the replica was forgotten meanwhile) is a no-op."""
        slot = self._slots.get(replica_id)
        if slot is None or not block_hashes:
            return
        removed = self._table.release_all(slot, block_hashes)
        if removed:
            left = self._blocks.get(replica_id, 0) - removed
            if left > 0:
                self._blocks[replica_id] = left
                return
            self._blocks.pop(replica_id, None)
        if replica_id not in self._blocks:  # nothing left on its way there
            self._table.clear(slot)
            self._slots.release(replica_id)

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks of the prompt on their way to each replica (none: left out)."""
        if not block_hashes or not self._blocks:
            return {}
        return self._table.match(block_hashes, self._slots.ids, 0.0, False)

    def size(self, replica_id: str) -> int:
        """Pending (block, request) pairs for the replica."""
        return self._blocks.get(replica_id, 0)
