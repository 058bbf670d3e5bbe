"""Decoding vLLM's KV-event messages, checked on bytes captured from vLLM 0.32 on CPU.

The fixtures (``tests/fixtures/vllm/kv_events.json``, made by ``capture.py``
there, and ``kv_events_salted.json`` of chats with ``cache_salt``, made by
``capture_salt.py``) hold the raw frames; the ``decoded`` copies beside them
are only used to cross-check what our decoder makes of the bytes.
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
    cache_salt_of,
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


# -- cache salts ---------------------------------------------------------------------------------


@cache
def captured_salted() -> dict[str, Any]:
    return json.loads((FIXTURES / "kv_events_salted.json").read_text(encoding="utf-8"))


def salted_batches() -> list[tuple[str, EventBatch]]:
    return [(m["step"], decode_message(frames_of(m))) for m in captured_salted()["messages"]]


def test_vllm_puts_the_cache_salt_in_extra_keys_of_a_requests_first_block_only() -> None:
    """Captured from vLLM 0.32: ``extra_keys`` is ``[["tenant-a"], ...]`` on block 0."""
    raw = [m["decoded"][1][0] for m in captured_salted()["messages"]]
    assert raw[0]["extra_keys"] == [["tenant-a"]] and raw[0]["parent_block_hash"] is None
    assert raw[1]["extra_keys"] == [None]  # the same chat without a salt
    assert raw[2]["extra_keys"] == [None]  # salted chat, new block chained onto a cached one
    assert raw[2]["parent_block_hash"] == raw[0]["block_hashes"][-1]
    assert raw[3]["extra_keys"] == [["tenant-b"], None]
    assert raw[4]["extra_keys"] == [["tenant-a"]]  # kv_cache_report_mode=full re-publishes the hit
    assert raw[0]["block_hashes"] != raw[1]["block_hashes"]  # the salt is in vLLM's hash


def test_the_salt_is_decoded_from_the_first_block() -> None:
    events = []
    for _, batch in salted_batches():
        (event,) = batch.events
        assert isinstance(event, BlockStored)
        events.append(event)
    assert [e.cache_salt for e in events] == ["tenant-a", None, None, "tenant-b", "tenant-a"]
    prompts = captured_salted()["prompts"]
    assert list(events[0].token_ids) == prompts["first"][:32]
    assert list(events[3].token_ids) == prompts["second"][:64]
    assert all(e.lora_name is None for e in events)


# Encoded by vLLM 0.32's own msgspec encoder: a BlockStored of a LoRA request
# with an image and prompt embeddings and cache_salt "tenant-a", its extra keys
# made by ``generate_block_hash_extra_keys`` and ``to_event_extra_keys``:
# [["adapter-x", ["img-1", 0], "tenant-a", b"\x07\x07"], ["adapter-x", ["img-1", -2]]].
LORA_MM_SALTED = bytes.fromhex(
    "93cb4004000000000000918aa474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573926566"
    "b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f6964739401020304aa626c6f636b5f73697a65"
    "02a76c6f72615f696407a66d656469756da3475055a96c6f72615f6e616d65a9616461707465722d78aa657874"
    "72615f6b6579739294a9616461707465722d7892a5696d672d3100a874656e616e742d61c402070792a9616461"
    "707465722d7892a5696d672d31fea967726f75705f6964780000"
)


def test_the_salt_is_found_after_the_lora_name_and_multimodal_keys() -> None:
    (event,) = decode_payload(LORA_MM_SALTED).events
    assert isinstance(event, BlockStored)
    assert event.lora_name == "adapter-x" and event.lora_id == 7
    assert event.cache_salt == "tenant-a"


@pytest.mark.parametrize(
    ("extra_keys", "lora_name", "salt"),
    [
        (None, None, None),
        ([], None, None),
        ([None, ["later"]], None, None),  # only block 0 can carry the salt
        ([["s"]], None, "s"),
        ([["adapter"]], "adapter", None),  # a LoRA name is not a salt
        ([["adapter", "adapter"]], "adapter", "adapter"),
        ([[["img", 3], "s", b"\x01"]], None, "s"),
        ([[["img", 3], b"\x01"]], None, None),
        ([[{"type": "lora", "name": "a"}, {"type": "cache_salt", "salt": "s"}]], "a", "s"),
        ([[{"type": "cache_salt", "salt": 1}]], None, None),
        ([42], None, None),
    ],
)  # fmt: skip
def test_cache_salt_of_reads_each_extra_key_shape(
    extra_keys: Any, lora_name: str | None, salt: str | None
) -> None:
    assert cache_salt_of(extra_keys, lora_name) == salt


def test_extra_keys_that_are_not_a_list_are_malformed() -> None:
    payload = msgpack.packb([1.0, [{"type": "BlockStored", "block_hashes": [1], "parent_block_hash": None,
                                    "token_ids": [1], "block_size": 1, "extra_keys": "salt"}]])  # fmt: skip
    with pytest.raises(KVEventDecodeError):
        decode_payload(payload)


def test_array_form_with_lora_name_and_extra_keys() -> None:
    payload = msgpack.packb(
        [1.0, [["BlockStored", [5], None, [1, 2], 2, 3, "GPU", "ad", [["ad", "salt"]]]]]
    )
    (event,) = decode_payload(payload).events
    assert event == BlockStored((5,), None, (1, 2), 2, 3, "GPU", "ad", "salt")
