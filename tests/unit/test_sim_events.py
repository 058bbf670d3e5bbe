"""vLLM's KV-event wire encoding, as the simulator publishes it."""

from __future__ import annotations

import msgpack

from engine.sim.events import ClearedAll, RemovedBlocks, StoredBlocks, batch_to_wire


def test_a_batch_is_a_positional_array_of_tagged_maps() -> None:
    stored = StoredBlocks((2**64 - 1, 7), None, tuple(range(8)), 4, (("salt",), None))
    batch = msgpack.unpackb(
        msgpack.packb(batch_to_wire(12.5, [stored, RemovedBlocks((7,)), ClearedAll()], 0))
    )
    ts, events, rank = batch
    assert ts == 12.5 and rank == 0
    assert events[0] == {
        "type": "BlockStored",
        "block_hashes": [2**64 - 1, 7],
        "parent_block_hash": None,
        "token_ids": list(range(8)),
        "block_size": 4,
        "lora_id": None,
        "medium": "GPU",
        "lora_name": None,
        "extra_keys": [["salt"], None],
        "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }
    assert events[1] == {
        "type": "BlockRemoved",
        "block_hashes": [7],
        "medium": "GPU",
        "group_idx": 0,
    }
    assert events[2] == {"type": "AllBlocksCleared"}
