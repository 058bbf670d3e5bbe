"""KV-cache events as the precise index consumes them.

These mirror vLLM's KV-event wire format (decoded in ``engine.kv_events``)
but carry no transport detail: hashes are the *engine's* block hashes as
unsigned 64-bit ints (or bytes, for engines that publish digests); the
precise index re-hashes ``token_ids`` into the gateway's own chain and keeps
a map from engine hashes to ours. A salted request's first block carries its
``cache_salt``, so the index can start that chain from the salted seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

EngineHash = int | bytes


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[EngineHash, ...]
    parent_block_hash: EngineHash | None
    token_ids: tuple[int, ...]
    """Token ids of all stored blocks, concatenated, ``block_size`` per block."""
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    cache_salt: str | None = None
    """The request's ``cache_salt`` when the engine mixed one into the hash of
    the *first* stored block (vLLM: only a request's block 0, published in
    ``extra_keys[0]``); ``None`` for unsalted requests and later blocks."""


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[EngineHash, ...]
    medium: str | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    """One published message: its sequence number and the events inside."""

    seq: int
    timestamp: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None


class KVEventConsumer(Protocol):
    """What a policy that learns from KV events offers the event subscriber
    (``Policy.event_consumer``; the precise index)."""

    def set_model(self, replica_id: str, model: str, lora_id: int | None = None) -> None: ...

    def set_seed(self, replica_id: str, seed: int, lora_id: int | None = None) -> None: ...

    def apply_events(self, replica_id: str, update: EventBatch | KVEvent) -> None: ...
