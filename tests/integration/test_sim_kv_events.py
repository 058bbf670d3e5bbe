"""KV-cache events of the simulated replica over ZMQ, decoded as vLLM's wire format.

The last tests put our subscriber and the precise index behind the sim's
sockets: a replica that cached a prefix before the subscriber started is
known from the replay buffer alone, and salted requests' blocks land in the
salted chain the gateway computes for them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import msgpack
import pytest
import zmq

from engine.kv_events import KVEventSubscriber, SubscriberConfig
from engine.sim.cache import block_hash, root_hash
from engine.tokenizer import ByteRenderer
from policies.hashing import block_hashes, chain_seed
from policies.precise_index import PreciseIndex
from tests.support.ports import free_port
from tests.support.sim import SimProcess, running_sim
from tests.support.waiting import eventually, wait_until

BLOCK = 16
END_SEQ = (-1).to_bytes(8, "big", signed=True)
MODEL = "sim-model"


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


def chat(
    sim: SimProcess, content: str | list[dict[str, str]], max_tokens: int = 1, **extra: Any
) -> None:
    messages = [{"role": "user", "content": content}] if isinstance(content, str) else content
    body = {"messages": messages, "max_tokens": max_tokens, "ignore_eos": True, **extra}
    assert httpx.post(f"{sim.v1_url}/chat/completions", json=body, timeout=30).status_code == 200


def prompt_ids(content: str | list[dict[str, str]]) -> list[int]:
    messages = [{"role": "user", "content": content}] if isinstance(content, str) else content
    return ByteRenderer().chat_token_ids({"messages": messages})


def replay_from(
    context: zmq.Context[zmq.Socket[bytes]], port: int, start: int
) -> list[tuple[int, list[Any]]]:
    dealer = context.socket(zmq.DEALER)
    dealer.connect(f"tcp://127.0.0.1:{port}")
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    batches: list[tuple[int, list[Any]]] = []
    try:
        while True:
            assert dealer.poll(5000), "no replay answer"
            empty, topic, seq, payload = dealer.recv_multipart()  # vLLM 0.32: four frames
            assert empty == b""
            if seq == END_SEQ:
                assert topic == b"" and payload == b""
                return batches
            assert topic == b"kv"
            batches.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
    finally:
        dealer.close(linger=0)


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


def stored_in_replay(
    context: zmq.Context[zmq.Socket[bytes]], port: int, token_ids: list[int]
) -> list[dict[str, Any]]:
    """The BlockStored events in the replay buffer whose tokens start ``token_ids``."""
    return [
        event
        for event in events_of(replay_from(context, port, 0), "BlockStored")
        if event["token_ids"] and token_ids[: len(event["token_ids"])] == event["token_ids"]
    ]


def subscriber_for(ports: tuple[int, int], index: PreciseIndex) -> KVEventSubscriber:
    config = SubscriberConfig(
        replica_id="s0",
        endpoint=f"tcp://127.0.0.1:{ports[0]}",
        replay_endpoint=f"tcp://127.0.0.1:{ports[1]}",
        topic="kv",
    )
    return KVEventSubscriber(config, index.apply)


def test_salted_requests_publish_their_salt_on_block_zero_only(
    sim: SimProcess, ports: tuple[int, int], context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    first = [{"role": "user", "content": "salted wire check " * 4}]
    chat(sim, first, cache_salt="tenant-a")
    ids = prompt_ids(first)
    wait_until(lambda: bool(stored_in_replay(context, ports[1], ids)), what="salted BlockStored")
    (event,) = stored_in_replay(context, ports[1], ids)
    full = len(ids) // BLOCK
    assert event["parent_block_hash"] is None
    assert event["extra_keys"] == [["tenant-a"]] + [None] * (full - 1)
    expected = [block_hash(root_hash(5), ids[:BLOCK], "tenant-a")]
    for index in range(1, full):
        expected.append(block_hash(expected[-1], ids[index * BLOCK : (index + 1) * BLOCK]))
    assert event["block_hashes"] == expected

    longer = [
        *first,
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "more " * 8},
    ]
    chat(sim, longer, cache_salt="tenant-a")

    def continuations() -> list[dict[str, Any]]:
        stored = events_of(replay_from(context, ports[1], 0), "BlockStored")
        return [e for e in stored if e["parent_block_hash"] == expected[-1]]

    wait_until(lambda: bool(continuations()), what="the continuation's BlockStored")
    (continuation,) = continuations()  # chained onto the salted blocks, no salt of its own
    assert continuation["extra_keys"] == [None] * len(continuation["block_hashes"])


async def test_a_prefix_cached_before_the_subscriber_started_is_known_at_once(
    sim: SimProcess, ports: tuple[int, int], context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    content = "warm start: a prefix the replica cached before anyone listened " * 3
    ids = prompt_ids(content)
    await asyncio.to_thread(chat, sim, content)
    await asyncio.to_thread(
        wait_until, lambda: bool(stored_in_replay(context, ports[1], ids)), 10.0, "BlockStored"
    )
    index = PreciseIndex()
    index.set_model("s0", MODEL)
    request = block_hashes(ids, BLOCK, chain_seed(MODEL, None))
    async with subscriber_for(ports, index) as subscriber:
        await eventually(
            lambda: index.match(request, now=0.0).get("s0") == len(request),
            what="the cached prefix in the index",
        )
        # Known from the replay buffer: not one live message has arrived.
        assert subscriber.stats.received == 0 and subscriber.stats.catch_ups == 1
    assert index.match(block_hashes(ids, BLOCK, chain_seed(MODEL, "x")), now=0.0) == {}


async def test_salted_chains_match_salted_requests_and_unsalted_ones_never(
    sim: SimProcess, ports: tuple[int, int], context: zmq.Context[zmq.Socket[bytes]]
) -> None:
    first = [{"role": "user", "content": "tenant data: the salted prefix of a private prompt " * 2}]
    ids = prompt_ids(first)
    await asyncio.to_thread(chat, sim, first, cache_salt="tenant-a")  # before the subscriber
    await asyncio.to_thread(
        wait_until, lambda: bool(stored_in_replay(context, ports[1], ids)), 10.0, "BlockStored"
    )
    index = PreciseIndex()
    index.set_model("s0", MODEL)

    def matched(token_ids: list[int], salt: str | None) -> int:
        hashes = block_hashes(token_ids, BLOCK, chain_seed(MODEL, salt))
        return index.match(hashes, now=0.0).get("s0", 0)

    async with subscriber_for(ports, index) as subscriber:
        await eventually(
            lambda: matched(ids, "tenant-a") == len(ids) // BLOCK,
            what="the salted prefix in the index",
        )
        assert matched(ids, None) == 0 and matched(ids, "tenant-b") == 0
        # Live now: a longer salted conversation extends the salted chain.
        longer = [
            *first,
            {"role": "assistant", "content": "noted"},
            {"role": "user", "content": "and a follow-up question " * 2},
        ]
        longer_ids = prompt_ids(longer)
        await asyncio.to_thread(chat, sim, longer, cache_salt="tenant-a")
        await eventually(
            lambda: matched(longer_ids, "tenant-a") == len(longer_ids) // BLOCK,
            what="the salted continuation in the index",
        )
        assert subscriber.stats.received >= 1
        assert matched(longer_ids, None) == 0
    assert index.stats("s0").salted_roots >= 1
