"""The precise prefix index: what each replica's KV cache holds, from its events.

Algorithm: every vLLM replica publishes KV-cache events (``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared``; see :mod:`policies.events`). The
index replays them into a per-replica set of blocks keyed by the gateway's
*own* chain hashes (:mod:`policies.hashing`), so a request's block hashes can
be matched directly and the engine's hash algorithm never matters:

* ``BlockStored``: the stored blocks' ``token_ids`` are split per
  ``block_size`` and chained onto the parent. The parent is looked up in a
  per-replica map *engine hash -> our hash*; a ``None`` parent means the
  blocks start a prompt, and the chain starts at the replica's seed
  (:meth:`PreciseIndex.set_model`: ``chain_seed(model, None)``). Each stored
  block's engine hash is then mapped to its hash in our chain. A parent we
  never saw (events lost, index started late, no seed set) cannot be placed:
  the blocks are counted as ``orphan_blocks`` and skipped.
* Cache salts: vLLM mixes a request's ``cache_salt`` into the hash of its
  block 0 only, and publishes it in that block's ``extra_keys`` (decoded into
  ``BlockStored.cache_salt``). An event whose first block carries a salt and
  has no parent -- or a parent we do not know: a salted block starts a
  request, whatever it names as parent -- starts its chain at
  ``chain_seed(model, salt)``, the seed the gateway gives a request with that
  salt. The blocks after it (the same event, and later events whose parent is
  a known salted block) continue that chain, so a salted request matches the
  blocks stored for its salt and an unsalted request never matches them.
  A salt needs the model name (``set_model``); with only ``set_seed``,
  salted root blocks are orphans.
* ``BlockRemoved``: engine hashes are translated through the map and removed.
* ``AllBlocksCleared``: the replica (that data-parallel rank) is emptied.

Several engine hashes may map to one of our hashes (different LoRA ids or
data-parallel ranks holding the same tokens), so blocks are reference
counted. Engine maps are kept per data-parallel rank (``EventBatch.data_
parallel_rank``) because ranks are separate caches that reuse hash values;
matching merges the ranks of a replica (its own balancer picks the rank).

Storage media: only events with medium ``None`` or ``"GPU"`` count. Blocks
offloaded to another tier (vLLM's CPU offloading publishes ``"CPU"``) are
ignored and counted as ``ignored_blocks``: a CPU hit still costs a transfer,
and folding it into the same "held" bit would overstate GPU hits.

Speculation: events arrive some milliseconds after the engine allocates the
blocks, so a burst of requests with a new prefix would scatter. When the
gateway routes a request, :meth:`speculate` marks its blocks as present on
that replica for ``speculative_ttl_seconds``; events confirm them meanwhile.

Storage: the confirmed blocks of every replica are one counted
:mod:`policies.block_table` (block hash -> replicas holding it, with each
replica's reference count), the speculative ones one ordered table (per
replica oldest first, each with its expiry). ``match`` walks the prompt's
hashes once over both, so replicas holding nothing of the prompt cost
nothing; a block held only speculatively counts while its expiry is ahead.
The engine maps stay per replica and rank (dicts in insertion order): most
of this index's memory (about 130 bytes per block in all at 1M blocks).

Parameters:

* ``speculative_ttl_seconds`` (default 2.0): how long a routed request's
  blocks count as present before events must confirm them.
* ``max_blocks_per_replica`` (default 524_288): memory guard per replica and
  rank; when events were lost and the map outgrows it, the oldest mappings
  are dropped (counted as ``overflow_drops``). It bounds each replica's
  speculative blocks too.
* ``table_factory`` (default: the compiled table when built): where the
  blocks are stored (:mod:`policies.block_table`; tests pass each one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from policies.block_table import BlockTable, BlockTableFactory, ReplicaSlots, default_tables
from policies.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineHash,
    EventBatch,
    KVEvent,
)
from policies.hashing import chain_seed, extend

_ACCEPTED_MEDIA = frozenset({"GPU"})


@dataclass(frozen=True, slots=True)
class PreciseIndexStats:
    confirmed_blocks: int
    speculative_blocks: int
    orphan_blocks: int
    ignored_blocks: int
    malformed_events: int
    unknown_removals: int
    overflow_drops: int
    salted_roots: int
    """Stored events that started a chain at a salted seed."""


class _ReplicaCache:
    """One replica: engine maps per rank and counters; its blocks live in the index's
    tables under ``slot`` (refcounts in our key space, speculation)."""

    __slots__ = (
        "confirmed",
        "engine_maps",
        "ignored_blocks",
        "malformed_events",
        "orphan_blocks",
        "overflow_drops",
        "salted_roots",
        "slot",
        "speculative",
        "unknown_removals",
    )

    def __init__(self, slot: int, confirmed: BlockTable, speculative: BlockTable) -> None:
        self.slot = slot
        self.confirmed = confirmed
        self.speculative = speculative
        self.engine_maps: dict[int | None, dict[EngineHash, int]] = {}
        self.orphan_blocks = 0
        self.ignored_blocks = 0
        self.malformed_events = 0
        self.unknown_removals = 0
        self.overflow_drops = 0
        self.salted_roots = 0

    def add(self, our_hash: int) -> None:
        self.confirmed.add(self.slot, our_hash)

    def release(self, our_hash: int) -> None:
        self.confirmed.release(self.slot, our_hash)

    def clear_rank(self, rank: int | None) -> None:
        engine_map = self.engine_maps.pop(rank, None)
        if engine_map is not None:
            for our_hash in engine_map.values():
                self.release(our_hash)
        self.speculative.clear(self.slot)


class PreciseIndex:
    def __init__(
        self,
        *,
        speculative_ttl_seconds: float = 2.0,
        max_blocks_per_replica: int = 524_288,
        table_factory: BlockTableFactory = default_tables,
    ) -> None:
        if speculative_ttl_seconds < 0:
            raise ValueError("speculative_ttl_seconds must not be negative")
        if max_blocks_per_replica <= 0:
            raise ValueError("max_blocks_per_replica must be positive")
        self.speculative_ttl_seconds = speculative_ttl_seconds
        self.max_blocks_per_replica = max_blocks_per_replica
        self._replicas: dict[str, _ReplicaCache] = {}
        self._slots = ReplicaSlots()
        self._confirmed = table_factory(False)
        self._speculative = table_factory(True)
        self._seeds: dict[tuple[str, int | None], int] = {}
        self._models: dict[tuple[str, int | None], str] = {}

    # -- configuration ----------------------------------------------------

    def set_model(self, replica_id: str, model: str, lora_id: int | None = None) -> None:
        """The model whose chains the replica stores: seeds ``chain_seed(model, salt)``.

        Unsalted root blocks start at ``chain_seed(model, None)``, salted ones
        at ``chain_seed(model, salt)``. ``lora_id`` registers the model name
        (the adapter's served name) for blocks stored under that LoRA adapter;
        without one, such root blocks are orphans.
        """
        self._models[(replica_id, lora_id)] = model
        self._seeds[(replica_id, lora_id)] = chain_seed(model, None)

    def set_seed(self, replica_id: str, seed: int, lora_id: int | None = None) -> None:
        """Only the unsalted chain seed (``chain_seed(model, None)``) for root blocks.

        Without the model name, salted root blocks cannot be placed and are
        counted as orphans; prefer :meth:`set_model`.
        """
        self._seeds[(replica_id, lora_id)] = seed
        self._models.pop((replica_id, lora_id), None)

    def _root(self, replica_id: str, lora_id: int | None, salt: str | None) -> int | None:
        if salt is None:
            return self._seeds.get((replica_id, lora_id))
        model = self._models.get((replica_id, lora_id))
        return None if model is None else chain_seed(model, salt)

    # -- events -----------------------------------------------------------

    def apply(self, replica_id: str, update: EventBatch | KVEvent) -> None:
        """Apply one published batch, or a single event (rank ``None``)."""
        if isinstance(update, EventBatch):
            for event in update.events:
                self._apply_event(replica_id, event, update.data_parallel_rank)
        else:
            self._apply_event(replica_id, update, None)

    def apply_events(self, replica_id: str, update: EventBatch | KVEvent) -> None:
        """The ``KVEventConsumer`` name of :meth:`apply`."""
        self.apply(replica_id, update)

    def _apply_event(self, replica_id: str, event: KVEvent, rank: int | None) -> None:
        cache = self._cache(replica_id)
        if isinstance(event, BlockStored):
            self._store(replica_id, cache, event, rank)
        elif isinstance(event, BlockRemoved):
            if not _accepted(event.medium):
                cache.ignored_blocks += len(event.block_hashes)
                return
            engine_map = cache.engine_maps.get(rank, {})
            for engine_hash in event.block_hashes:
                our_hash = engine_map.pop(engine_hash, None)
                if our_hash is None:
                    cache.unknown_removals += 1
                else:
                    cache.release(our_hash)
        elif isinstance(event, AllBlocksCleared):
            cache.clear_rank(rank)

    def _store(
        self, replica_id: str, cache: _ReplicaCache, event: BlockStored, rank: int | None
    ) -> None:
        count = len(event.block_hashes)
        if not _accepted(event.medium):
            cache.ignored_blocks += count
            return
        block_size = event.block_size
        if block_size <= 0 or len(event.token_ids) < count * block_size:
            cache.malformed_events += 1
            return
        engine_map = cache.engine_maps.setdefault(rank, {})
        parent_hash = event.parent_block_hash
        parent = None if parent_hash is None else engine_map.get(parent_hash)
        if parent is None and (parent_hash is None or event.cache_salt is not None):
            parent = self._root(replica_id, event.lora_id, event.cache_salt)
            if parent is not None and event.cache_salt is not None:
                cache.salted_roots += 1
        if parent is None:
            cache.orphan_blocks += count
            return
        our_hashes = extend(parent, event.token_ids[: count * block_size], block_size)
        for engine_hash, our_hash in zip(event.block_hashes, our_hashes):
            previous = engine_map.pop(engine_hash, None)
            if previous is not None:
                cache.release(previous)
            engine_map[engine_hash] = our_hash
            cache.add(our_hash)
        while len(engine_map) > self.max_blocks_per_replica:
            oldest = next(iter(engine_map))
            cache.release(engine_map.pop(oldest))
            cache.overflow_drops += 1

    # -- speculation ------------------------------------------------------

    def speculate(self, replica_id: str, block_hashes: Sequence[int], now: float) -> None:
        """The gateway routed these blocks to the replica: count them until confirmed."""
        if self.speculative_ttl_seconds == 0:
            return
        slot = self._cache(replica_id).slot
        speculative = self._speculative
        speculative.touch(slot, block_hashes, now + self.speculative_ttl_seconds, False)
        # The oldest go while over the guard or expired (expiry ``<= now``).
        speculative.evict(slot, self.max_blocks_per_replica)
        speculative.drop_stale(slot, now, True)

    # -- queries ----------------------------------------------------------

    def match(self, block_hashes: Sequence[int], now: float) -> dict[str, int]:
        """Leading blocks of the prompt each replica holds or is speculated to hold."""
        return self._confirmed.match(block_hashes, self._slots.ids, now, True,
                                     self._speculative)

    def holds(self, replica_id: str, block_hash: int) -> bool:
        """Whether events confirmed the block on the replica (speculation aside)."""
        cache = self._replicas.get(replica_id)
        return cache is not None and self._confirmed.count(cache.slot, block_hash) > 0

    def size(self, replica_id: str) -> int:
        """Distinct confirmed blocks of a replica."""
        cache = self._replicas.get(replica_id)
        return 0 if cache is None else self._confirmed.size(cache.slot)

    def stats(self, replica_id: str) -> PreciseIndexStats:
        cache = self._replicas.get(replica_id)
        if cache is None:
            return PreciseIndexStats(0, 0, 0, 0, 0, 0, 0, 0)
        return PreciseIndexStats(
            confirmed_blocks=self._confirmed.size(cache.slot),
            speculative_blocks=self._speculative.size(cache.slot),
            orphan_blocks=cache.orphan_blocks,
            ignored_blocks=cache.ignored_blocks,
            malformed_events=cache.malformed_events,
            unknown_removals=cache.unknown_removals,
            overflow_drops=cache.overflow_drops,
            salted_roots=cache.salted_roots,
        )

    def replicas(self) -> list[str]:
        return sorted(self._replicas)

    # -- lifecycle --------------------------------------------------------

    def clear(self, replica_id: str) -> None:
        """Drop a replica's blocks and counters (it went unhealthy); seeds and models are kept."""
        if self._replicas.pop(replica_id, None) is not None:
            slot = self._slots.release(replica_id)
            assert slot is not None
            self._confirmed.clear(slot)
            self._speculative.clear(slot)

    # -- the PrefixIndex interface (policies.index) -----------------------

    def record(self, replica_id: str, block_hashes: Sequence[int], now: float) -> None:
        """The gateway routed these blocks there: speculative until events confirm them."""
        self.speculate(replica_id, block_hashes, now)

    def set_capacity(self, replica_id: str, blocks: int) -> None:
        """Nothing to size: the engine's own events say what it holds and evicts."""

    def forget_replica(self, replica_id: str) -> None:
        self.clear(replica_id)

    def _cache(self, replica_id: str) -> _ReplicaCache:
        cache = self._replicas.get(replica_id)
        if cache is None:
            cache = _ReplicaCache(self._slots.slot(replica_id), self._confirmed,
                                  self._speculative)
            self._replicas[replica_id] = cache
        return cache


def _accepted(medium: str | None) -> bool:
    return medium is None or medium.upper() in _ACCEPTED_MEDIA
