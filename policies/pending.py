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

Storage: one dict, block hash -> {replica: requests in flight holding it}.
Chained hashes make a held block imply its whole prefix, so a replica's
pending blocks are closed under prefixes and the walk stops at the first
block a replica lacks. ``add`` and ``discard`` cost O(blocks of the
request); ``match`` O(matched blocks x replicas still matching). Memory is
bounded by the requests in flight: every ``add`` is followed by its
``discard`` (the gateway's lease on the request guarantees it), even when the
replica left rotation meanwhile.
"""

from __future__ import annotations

from collections.abc import Sequence


class PendingPrefixes:
    def __init__(self) -> None:
        self._holders: dict[int, dict[str, int]] = {}
        self._blocks: dict[str, int] = {}
        """Per replica, the pending (block, request) pairs: a size for the ops view."""

    def add(self, replica_id: str, block_hashes: Sequence[int]) -> None:
        """A request holding ``block_hashes`` was sent to ``replica_id``."""
        holders = self._holders
        for block_hash in block_hashes:
            counts = holders.get(block_hash)
            if counts is None:
                holders[block_hash] = {replica_id: 1}
            else:
                counts[replica_id] = counts.get(replica_id, 0) + 1
        if block_hashes:
            self._blocks[replica_id] = self._blocks.get(replica_id, 0) + len(block_hashes)

    def discard(self, replica_id: str, block_hashes: Sequence[int]) -> None:
        """That request's prefill is confirmed, or it will never happen. Discarding
        what was not added (the replica was forgotten meanwhile) is a no-op."""
        holders = self._holders
        removed = 0
        for block_hash in block_hashes:
            counts = holders.get(block_hash)
            if counts is None:
                continue
            held = counts.get(replica_id)
            if held is None:
                continue
            removed += 1
            if held > 1:
                counts[replica_id] = held - 1
            else:
                del counts[replica_id]
                if not counts:
                    del holders[block_hash]
        if removed:
            left = self._blocks.get(replica_id, 0) - removed
            if left > 0:
                self._blocks[replica_id] = left
            else:
                self._blocks.pop(replica_id, None)

    def match(self, block_hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks of the prompt on their way to each replica (none: left out)."""
        if not block_hashes:
            return {}
        first = self._holders.get(block_hashes[0])
        if not first:
            return {}
        live = set(first)
        matched: dict[str, int] = {}
        holders = self._holders
        index = 1
        for index in range(1, len(block_hashes)):
            counts = holders.get(block_hashes[index])
            if counts is None:
                break
            if len(counts) < len(live) or not live.issubset(counts):
                for replica_id in [r for r in live if r not in counts]:
                    matched[replica_id] = index
                    live.discard(replica_id)
                if not live:
                    return matched
        else:
            index = len(block_hashes)
        for replica_id in live:
            matched[replica_id] = index
        return matched

    def size(self, replica_id: str) -> int:
        """Pending (block, request) pairs for the replica."""
        return self._blocks.get(replica_id, 0)
