"""Decoding vLLM's KV-event messages, checked on bytes captured from vLLM 0.32 on CPU.

The fixtures (``tests/fixtures/vllm/kv_events.json``, made by ``capture.py``
there) hold the raw frames; the ``decoded`` copies beside them are only used
to cross-check what our decoder makes of the bytes.
"""

from __future__ import annotations

import base64
import json
from functools import cache
from pathlib import Path
from typing import Any

import msgpack
import pytest

from engine.kv_events import (
    KVEventDecodeError,
    decode_message,
    decode_payload,
    split_replay_reply,
)
from policies.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"


@cache
def captured() -> dict[str, Any]:
    return json.loads((FIXTURES / "kv_events.json").read_text(encoding="utf-8"))


def frames_of(message: dict[str, Any]) -> list[bytes]:
    return [
        bytes.fromhex(message["topic_hex"]),
        bytes.fromhex(message["seq_hex"]),
        base64.b64decode(message["payload_b64"]),
    ]


def batches() -> list[tuple[str, EventBatch]]:
    return [(m["step"], decode_message(frames_of(m))) for m in captured()["messages"]]


def test_every_captured_message_decodes_with_its_sequence_number() -> None:
    decoded = batches()
    assert [batch.seq for _, batch in decoded] == list(range(len(decoded)))
    for message, (_, batch) in zip(captured()["messages"], decoded):
        assert [type(e).__name__ for e in batch.events] == [
            e["type"] for e in message["decoded"][1]
        ]
        assert batch.timestamp == message["decoded"][0]
        assert batch.data_parallel_rank == 0


def test_stored_blocks_carry_the_prompt_tokens_vllm_tokenized() -> None:
    """The first chat's stored blocks are the /tokenize output cut into 32-token blocks."""
    step, first = batches()[0]
    assert step.startswith("chat")
    (stored,) = first.events
    assert isinstance(stored, BlockStored)
    tokenized = json.loads((FIXTURES / "tokenize.json").read_text(encoding="utf-8"))[0]
    prompt = tokenized["body"]["tokens"]
    full_blocks = len(prompt) // 32
    assert stored.block_size == 32
    assert stored.parent_block_hash is None
    assert len(stored.block_hashes) == full_blocks
    assert list(stored.token_ids) == prompt[: full_blocks * 32]
    assert stored.medium == "GPU"
    assert stored.lora_id is None
    assert all(isinstance(h, int) and 0 <= h < 2**64 for h in stored.block_hashes)


def test_a_block_filled_while_decoding_chains_onto_the_prompt_blocks() -> None:
    (_, first), (_, second) = batches()[:2]
    (prompt_blocks,) = first.events
    (decoded_block,) = second.events
    assert isinstance(prompt_blocks, BlockStored) and isinstance(decoded_block, BlockStored)
    assert decoded_block.parent_block_hash == prompt_blocks.block_hashes[-1]
    assert len(decoded_block.token_ids) == decoded_block.block_size == 32


def test_eviction_and_reset_arrive_as_removed_and_cleared_events() -> None:
    steps = batches()
    removed = [e for step, b in steps if "eviction" in step for e in b.events]
    assert any(isinstance(e, BlockRemoved) for e in removed)
    for event in removed:
        if isinstance(event, BlockRemoved):
            assert event.medium == "GPU" and len(event.block_hashes) == 1
    cleared = [e for step, b in steps if "reset_prefix_cache" in step for e in b.events]
    assert isinstance(cleared[0], AllBlocksCleared)


def test_evicted_hashes_are_ones_stored_earlier() -> None:
    stored: set[int | bytes] = set()
    for _, batch in batches():
        for event in batch.events:
            if isinstance(event, BlockStored):
                stored.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                assert set(event.block_hashes) <= stored


def test_replay_replies_parse_and_end_with_the_marker() -> None:
    live = {m["seq"]: base64.b64decode(m["payload_b64"]) for m in captured()["messages"]}
    for exchange in captured()["replays"]:
        replies = [[bytes.fromhex(f) for f in frames] for frames in exchange["reply_frames_hex"]]
        parsed = [split_replay_reply(frames) for frames in replies]
        assert parsed[-1] == (-1, b"")
        data = parsed[:-1]
        assert [seq for seq, _ in data] == [s for s in sorted(live) if s >= exchange["start_seq"]]
        for seq, payload in data:
            assert payload == live[seq]


def test_replay_reply_without_topic_frame_older_form() -> None:
    assert split_replay_reply([b"", (7).to_bytes(8, "big"), b"x"]) == (7, b"x")
    assert split_replay_reply([b"", b"\xff" * 8, b""]) == (-1, b"")


def test_array_form_of_older_vllm_decodes_the_same() -> None:
    payload = msgpack.packb(
        [
            1.5,
            [
                ["BlockStored", [11, 12], None, list(range(8)), 4, None, "GPU"],
                ["BlockRemoved", [11], "GPU"],
                ["AllBlocksCleared"],
            ],
        ]
    )
    batch = decode_payload(payload, seq=3)
    assert batch == EventBatch(
        seq=3,
        timestamp=1.5,
        events=(
            BlockStored((11, 12), None, tuple(range(8)), 4, None, "GPU"),
            BlockRemoved((11,), "GPU"),
            AllBlocksCleared(),
        ),
        data_parallel_rank=None,
    )


def test_byte_hashes_and_unknown_fields_and_event_types() -> None:
    payload = msgpack.packb(
        [
            2.0,
            [
                {"type": "SomethingNew", "x": 1},
                {
                    "type": "BlockRemoved",
                    "block_hashes": [b"\x01" * 32],
                    "medium": "CPU",
                    "later": 1,
                },
            ],
            1,
        ]
    )
    batch = decode_payload(payload)
    assert batch.events == (BlockRemoved((b"\x01" * 32,), "CPU"),)
    assert batch.data_parallel_rank == 1


@pytest.mark.parametrize(
    "payload",
    [
        b"\xc1",  # not msgpack
        msgpack.packb({"ts": 1.0, "events": []}),
        msgpack.packb([1.0]),
        msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}]]),
        msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [1]}]]),
        msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                              "token_ids": ["a"], "block_size": 1}]]),
        msgpack.packb([1.0, [42]]),
    ],
)  # fmt: skip
def test_malformed_payloads_raise_a_decode_error(payload: bytes) -> None:
    with pytest.raises(KVEventDecodeError):
        decode_payload(payload)


def test_messages_must_have_three_frames_and_an_eight_byte_sequence() -> None:
    with pytest.raises(KVEventDecodeError):
        decode_message([b"kv", b"\x00" * 8])
    with pytest.raises(KVEventDecodeError):
        decode_message([b"kv", b"\x00", msgpack.packb([1.0, []])])
