"""Block-level prefix cache of the simulated engine (vLLM V1's block pool).

Hashing. A prompt is cut into full blocks of ``block_size`` tokens; a partial
tail block is never cached. Block ``i`` is keyed by a chain hash::

    h_0 = H(root, tokens_0, cache_salt)      # salt only in the first block
    h_i = H(h_{i-1}, tokens_i)

where ``H`` is the first 8 bytes of BLAKE2b, read as an unsigned 64-bit int,
and ``root`` depends on ``--seed`` (vLLM's ``NONE_HASH``). This is
deliberately *not* the gateway's xxh3 chain: the gateway must map engine
hashes to its own, as it must with a real vLLM.

Pool. ``num_blocks`` blocks, each with a reference count. Blocks with no
reference sit in a free queue in eviction order (head = evicted next);
cached blocks stay findable there until a new allocation pops them, which
is when they are evicted (``BlockRemoved``). A cache hit on a free block
takes it out of the queue; a finished request returns its blocks to the
tail, last block first, so a request's tail is evicted before its head
(vLLM frees ``reversed(blocks)``). Like vLLM, blocks are registered as
cached when they are *scheduled* full, identical blocks computed by two
requests at once are both kept (a hash may map to several blocks, each with
its own ``BlockStored``/``BlockRemoved``), and a reset only succeeds when no
block is in use.

Hits. Only whole blocks hit, and at least the last prompt token is always
recomputed: a fully cached prompt of ``L`` tokens hits
``(L - 1) // block_size`` blocks.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence

from engine.sim.events import CacheEvent, ClearedAll, RemovedBlocks, StoredBlocks


def root_hash(seed: int) -> int:
    digest = hashlib.blake2b(
        b"prefixgate-sim-root" + seed.to_bytes(8, "big", signed=True), digest_size=8
    )
    return int.from_bytes(digest.digest(), "big")


def block_hash(parent: int, token_ids: Sequence[int], cache_salt: str | None = None) -> int:
    """``H(parent, tokens[, salt])`` as an unsigned 64-bit int."""
    digest = hashlib.blake2b(parent.to_bytes(8, "big"), digest_size=8)
    digest.update(array("Q", token_ids).tobytes())
    if cache_salt is not None:
        digest.update(b"\x00salt\x00" + cache_salt.encode("utf-8"))
    return int.from_bytes(digest.digest(), "big")


class PrefixCache:
    """Fixed pool of reference-counted blocks with an LRU free queue."""

    def __init__(self, num_blocks: int, block_size: int, seed: int = 0,
                 record_events: bool = True) -> None:
        """``record_events=False``: no KV events are kept (nobody subscribes: a replay whose
        policy does not learn from them skips building one per stored and evicted block)."""
        if num_blocks <= 0 or block_size <= 0:
            raise ValueError("num_blocks and block_size must be positive")
        self.record_events = record_events
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.root = root_hash(seed)
        self._ref_count = [0] * num_blocks
        self._hash_of: list[int | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[int, dict[int, None]] = {}
        self._events: list[CacheEvent] = []

    # -- hashing -----------------------------------------------------------

    def extend_hashes(
        self, hashes: list[int], token_ids: Sequence[int], cache_salt: str | None
    ) -> None:
        """Append to ``hashes`` the chain hashes of blocks of ``token_ids`` that
        became full since ``hashes`` was last extended."""
        size = self.block_size
        for index in range(len(hashes), len(token_ids) // size):
            parent = hashes[-1] if hashes else self.root
            salt = cache_salt if index == 0 else None
            hashes.append(block_hash(parent, token_ids[index * size : (index + 1) * size], salt))

    # -- state -------------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - len(self._free) / self.num_blocks

    @property
    def num_cached_blocks(self) -> int:
        return sum(len(ids) for ids in self._cached.values())

    def ref_count(self, block_id: int) -> int:
        return self._ref_count[block_id]

    def is_cached(self, block_hash_value: int) -> bool:
        return block_hash_value in self._cached

    def eviction_order(self) -> list[int]:
        """Free block ids, next to be evicted first (for tests and debugging)."""
        return list(self._free)

    def take_events(self) -> list[CacheEvent]:
        events, self._events = self._events, []
        return events

    # -- lookups and allocation -------------------------------------------

    def lookup(self, hashes: Sequence[int], num_tokens: int) -> list[int]:
        """Block ids of the longest cached prefix, leaving the last token to compute."""
        limit = min(len(hashes), max(num_tokens - 1, 0) // self.block_size)
        hit: list[int] = []
        for value in hashes[:limit]:
            holders = self._cached.get(value)
            if not holders:
                break
            hit.append(next(iter(holders)))
        return hit

    def acquire(self, block_ids: Sequence[int]) -> None:
        """Take a reference on cached blocks found by :meth:`lookup`."""
        for block_id in block_ids:
            if self._ref_count[block_id] == 0:
                del self._free[block_id]
            self._ref_count[block_id] += 1

    def allocate(self, count: int) -> list[int] | None:
        """``count`` new blocks from the head of the free queue, or ``None``."""
        if count > len(self._free):
            return None
        allocated: list[int] = []
        for _ in range(count):
            block_id, _ = self._free.popitem(last=False)
            self._evict(block_id)
            self._ref_count[block_id] = 1
            allocated.append(block_id)
        return allocated

    def release(self, block_ids: Sequence[int]) -> None:
        """Drop one reference each; blocks that reach zero rejoin the free queue
        in the given order (pass a request's blocks reversed): cached blocks at
        its tail (evicted last: LRU), blocks with no hash -- a partial last
        block holds nothing a later request can hit -- at its head, reused
        first, as vLLM 0.32's ``BlockPool.free_blocks`` does (``prepend_n``).
        Queued at the tail they would push a cached block out per request."""
        reuse_first: list[int] = []
        for block_id in block_ids:
            self._ref_count[block_id] -= 1
            if self._ref_count[block_id] < 0:
                raise RuntimeError(f"block {block_id} released more often than acquired")
            if self._ref_count[block_id] == 0:
                if self._hash_of[block_id] is None:
                    reuse_first.append(block_id)
                else:
                    self._free[block_id] = None
        for block_id in reversed(reuse_first):
            self._free[block_id] = None
            self._free.move_to_end(block_id, last=False)

    def commit(
        self,
        block_ids: Sequence[int],
        hashes: Sequence[int],
        token_ids: Sequence[int],
        num_cached_blocks: int,
        num_full_blocks: int,
        cache_salt: str | None,
    ) -> int:
        """Register a request's blocks ``[num_cached_blocks, num_full_blocks)``
        as cached and record one ``BlockStored``; returns the new cached count."""
        if num_full_blocks <= num_cached_blocks:
            return num_cached_blocks
        size = self.block_size
        new_hashes: list[int] = []
        for index in range(num_cached_blocks, num_full_blocks):
            block_id, value = block_ids[index], hashes[index]
            self._hash_of[block_id] = value
            self._cached.setdefault(value, {})[block_id] = None
            new_hashes.append(value)
        if not self.record_events:
            return num_full_blocks
        self._events.append(
            StoredBlocks(
                block_hashes=tuple(new_hashes),
                parent_block_hash=hashes[num_cached_blocks - 1] if num_cached_blocks else None,
                token_ids=tuple(token_ids[num_cached_blocks * size : num_full_blocks * size]),
                block_size=size,
                extra_keys=tuple(
                    (cache_salt,) if index == 0 and cache_salt is not None else None
                    for index in range(num_cached_blocks, num_full_blocks)
                ),
            )
        )
        return num_full_blocks

    def reset(self) -> bool:
        """Forget every cached block; refused (``False``) while any block is held."""
        if any(self._ref_count):
            return False
        for block_id in range(self.num_blocks):
            self._hash_of[block_id] = None
        self._cached.clear()
        if self.record_events:
            self._events.append(ClearedAll())
        return True

    def _evict(self, block_id: int) -> None:
        value = self._hash_of[block_id]
        if value is None:
            return
        self._hash_of[block_id] = None
        holders = self._cached[value]
        del holders[block_id]
        if not holders:
            del self._cached[value]
        if self.record_events:
            self._events.append(RemovedBlocks(block_hashes=(value,)))
