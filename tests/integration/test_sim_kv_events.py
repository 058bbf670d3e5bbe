"""KV-cache events of the simulated replica over ZMQ, decoded as vLLM's wire format."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgpack
import pytest
import zmq

from engine.sim.cache import block_hash, root_hash
from engine.tokenizer import ByteRenderer
from tests.support.ports import free_port
from tests.support.sim import SimProcess, running_sim

BLOCK = 16
END_SEQ = (-1).to_bytes(8, "big", signed=True)


@pytest.fixture(scope="module")
def ports() -> tuple[int, int]:
    return free_port(), free_port()


@pytest.fixture(scope="module")
def sim(ports: tuple[int, int]) -> Iterator[SimProcess]:
    pub, replay = ports
    args = (
        "--time-scale", "50", "--block-size", str(BLOCK), "--num-blocks", "64", "--max-model-len", "1024",
        "--kv-events-port", str(pub), "--kv-events-replay-port", str(replay), "--kv-events-topic", "kv",
        "--seed", "5",
    )  # fmt: skip
    with running_sim(*args) as process:
        yield process


@pytest.fixture
def context() -> Iterator[zmq.Context[zmq.Socket[bytes]]]:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def chat(sim: SimProcess, content: str, max_tokens: int = 1) -> None:
    body = {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    assert httpx.post(f"{sim.v1_url}/chat/completions", json=body, timeout=30).status_code == 200


def prompt_ids(content: str) -> list[int]:
    return ByteRenderer().chat_token_ids({"messages": [{"role": "user", "content": content}]})


def replay_from(
    context: zmq.Context[zmq.Socket[bytes]], port: int, start: int
) -> list[tuple[int, list[Any]]]:
    dealer = context.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    batches: list[tuple[int, list[Any]]] = []
    while True:
        assert dealer.poll(5000), "no replay answer"
        empty, seq, payload = dealer.recv_multipart()
        assert empty == b""
        if seq == END_SEQ:
            assert payload == b""
            return batches
        batches.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload)))


def events_of(batches: list[tuple[int, list[Any]]], kind: str) -> list[dict[str, Any]]:
    return [event for _, batch in batches for event in batch[1] if event["type"] == kind]


def test_subscriber_receives_block_stored_in_vllm_format(
    sim: SimProcess, ports: tuple[int, int], context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    sub = context.socket(zmq.SUB)
    sub.connect(f"tcp://127.0.0.1:{ports[0]}")
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    content = "the quick brown fox jumps over the lazy dog, twice over"
    received: list[list[bytes]] = []
    deadline = time.monotonic() + 10
    # A new subscription takes a moment to reach the publisher; resend until one arrives.
    while not received and time.monotonic() < deadline:
        chat(sim, content)
        if sub.poll(200):
            received.append(sub.recv_multipart())
    assert received, "no KV event batch reached the subscriber"
    topic, seq, payload = received[0]
    assert topic == b"kv" and len(seq) == 8
    ts, events, dp_rank = msgpack.unpackb(payload)
    assert isinstance(ts, float) and dp_rank == 0
    stored = [event for event in events if event["type"] == "BlockStored"]
    assert stored
    event = stored[0]
    assert list(event) == [
        "type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
        "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
    ]  # fmt: skip
    ids = prompt_ids(content)
    full = len(ids) // BLOCK
    assert event["block_size"] == BLOCK and event["parent_block_hash"] is None
    assert event["token_ids"] == ids[: full * BLOCK]
    expected, parent = [], root_hash(5)
    for index in range(full):
        parent = block_hash(parent, ids[index * BLOCK : (index + 1) * BLOCK])
        expected.append(parent)
    assert event["block_hashes"] == expected
    assert all(0 <= value < 2**64 for value in event["block_hashes"])
    assert event["medium"] == "GPU" and event["extra_keys"] == [None] * full


def test_replay_serves_buffered_batches_then_the_end_marker(
    sim: SimProcess, ports: tuple[int, int], context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    chat(sim, "replay me " * 10)
    batches = replay_from(context, ports[1], 0)
    seqs = [seq for seq, _ in batches]
    assert seqs[0] == 0 and seqs == list(range(len(seqs)))
    assert events_of(batches, "BlockStored")
    later = replay_from(context, ports[1], seqs[-1])
    assert [seq for seq, _ in later] == [seqs[-1]]
    assert replay_from(context, ports[1], seqs[-1] + 1000) == []


def test_eviction_and_reset_are_published(
    sim: SimProcess, ports: tuple[int, int], context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    # 64 blocks of 16 tokens: a few distinct long prompts must evict older blocks.
    for index in range(6):
        chat(sim, f"{index} " + "filler text to fill the cache " * 16)
    assert httpx.post(f"{sim.base_url}/reset_prefix_cache").status_code == 200
    chat(sim, "after reset " * 4)
    batches = replay_from(context, ports[1], 0)
    removed = events_of(batches, "BlockRemoved")
    assert removed and set(removed[0]) == {"type", "block_hashes", "medium", "group_idx"}
    stored_hashes = {
        value for event in events_of(batches, "BlockStored") for value in event["block_hashes"]
    }
    assert all(value in stored_hashes for event in removed for value in event["block_hashes"])
    cleared = events_of(batches, "AllBlocksCleared")
    assert cleared == [{"type": "AllBlocksCleared"}]
