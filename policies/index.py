"""The interface every prefix index offers a cache-aware policy.

Two implementations: :class:`policies.prefix_index.ApproximatePrefixIndex`
(what the gateway itself routed, LRU per replica sized by its KV capacity,
aged by a TTL) and :class:`policies.precise_index.PreciseIndex` (what each
replica's KV-cache events say it holds, plus short speculative entries for
what was just routed there). A policy sees only this:

* ``match(block_hashes, now)``: leading blocks of the prompt each replica
  holds (replicas holding none may be left out);
* ``record(replica_id, block_hashes, now)``: the gateway sent these blocks
  there;
* ``set_capacity(replica_id, blocks)``: the replica's real KV capacity, when
  it publishes one (an index that learns from the engine may ignore it);
* ``forget_replica(replica_id)``: the replica went away or restarted;
* ``size(replica_id)``: blocks the index holds for it (the ops view).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class PrefixIndex(Protocol):
    def match(self, block_hashes: Sequence[int], now: float) -> dict[str, int]: ...

    def record(self, replica_id: str, block_hashes: Sequence[int], now: float) -> None: ...

    def set_capacity(self, replica_id: str, blocks: int) -> None: ...

    def forget_replica(self, replica_id: str) -> None: ...

    def size(self, replica_id: str) -> int: ...
