"""KV-cache events of the simulated engine and their vLLM wire form.

The block pool records what happens to cached blocks as plain values; the
publisher turns a step's worth of them into one vLLM ``KVEventBatch``.

Wire form (checked against ``vllm/distributed/kv_events.py``): events are
msgspec structs with ``tag=True, omit_defaults=True``. Since vLLM moved from
``array_like=True`` to named-field maps (v0.26+; the outer batch stayed a
positional array), each event is a msgpack *map* tagged by ``"type"`` whose
keys follow the struct's declaration order. Fields that have no default are
always present (even when ``None``); fields equal to their default are left
out, which is why ``kv_cache_spec_sliding_window`` never appears for
full-attention models and ``AllBlocksCleared`` is just ``{"type": ...}``.
Block hashes are unsigned 64-bit ints (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``
default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, TypeAlias

MEDIUM_GPU = "GPU"
FULL_ATTENTION = "full_attention"


@dataclass(frozen=True, slots=True)
class StoredBlocks:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    extra_keys: tuple[tuple[str, ...] | None, ...]
    """One entry per block: the keys mixed into its hash besides the tokens
    (here only ``cache_salt``, on a request's first block), else ``None``."""


@dataclass(frozen=True, slots=True)
class RemovedBlocks:
    block_hashes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ClearedAll:
    pass


CacheEvent: TypeAlias = StoredBlocks | RemovedBlocks | ClearedAll


def to_wire(event: CacheEvent) -> dict[str, Any]:
    """The msgpack map vLLM's encoder produces for this event."""
    if isinstance(event, StoredBlocks):
        return {
            "type": "BlockStored",
            "block_hashes": list(event.block_hashes),
            "parent_block_hash": event.parent_block_hash,
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": None,
            "medium": MEDIUM_GPU,
            "lora_name": None,
            "extra_keys": [list(keys) if keys is not None else None for keys in event.extra_keys],
            "group_idx": 0,
            "kv_cache_spec_kind": FULL_ATTENTION,
        }
    if isinstance(event, RemovedBlocks):
        return {
            "type": "BlockRemoved",
            "block_hashes": list(event.block_hashes),
            "medium": MEDIUM_GPU,
            "group_idx": 0,
        }
    return {"type": "AllBlocksCleared"}


def batch_to_wire(timestamp: float, events: list[CacheEvent], dp_rank: int | None = 0) -> list[Any]:
    """One ``KVEventBatch``: ``[ts, [event maps], data_parallel_rank]``."""
    return [timestamp, [to_wire(event) for event in events], dp_rank]
