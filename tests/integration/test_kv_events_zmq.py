"""The KV-event subscriber over real ZMQ sockets, against a publisher in this process.

The publisher replays payloads captured from vLLM 0.32 (tests/fixtures/vllm)
with the same framing vLLM uses: an XPUB socket (a PUB that also tells us
when the subscriber has joined, so no message is lost to the slow-joiner
race) and a ROUTER replay socket answering ``[b"", start_seq]`` with
``[b"", topic, seq, payload]`` frames and the ``-1`` end marker. Its replay
answers can be held back (``answering``) to pin down what the subscriber
does while a catch-up is in flight.

Every subscriber asks for the replay buffer as soon as it is connected (the
warm start); tests about the live stream wait for that catch-up first
(:func:`joined`), so their live messages are not also served by it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.asyncio

from engine.kv_events import END_SEQ, SYNTHETIC_SEQ, KVEventSubscriber, SubscriberConfig
from policies.events import AllBlocksCleared, EventBatch
from policies.hashing import block_hashes, chain_seed
from policies.precise_index import PreciseIndex
from tests.support.waiting import eventually

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
TOPIC = b"kv"


def captured_payloads(name: str = "kv_events.json") -> list[bytes]:
    data = json.loads((FIXTURES / name).read_text(encoding="utf-8"))
    return [base64.b64decode(m["payload_b64"]) for m in data["messages"]]


class FakePublisher:
    """vLLM's ZmqEventPublisher framing, with knobs to drop messages on the live socket."""

    def __init__(self, context: zmq.asyncio.Context, *, topic_in_replay: bool = True) -> None:
        self.pub = context.socket(zmq.XPUB)
        self.router = context.socket(zmq.ROUTER)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.replay_endpoint = f"tcp://127.0.0.1:{replay_port}"
        self.buffer: list[tuple[int, bytes]] = []
        self.next_seq = 0
        self.topic_in_replay = topic_in_replay
        self.replay_requests: list[int] = []
        self.requested = asyncio.Event()
        """Set when a replay request has arrived (cleared by the test)."""
        self.answering = asyncio.Event()
        """Replay requests are answered only while this is set."""
        self.answering.set()
        self._context = context
        self._server = asyncio.get_running_loop().create_task(self._serve_replay())

    async def wait_subscribed(self) -> None:
        message = await asyncio.wait_for(self.pub.recv(), timeout=10)
        assert message == b"\x01" + TOPIC

    def go_away(self) -> None:
        """Close the PUB socket: subscribers lose their connection and keep retrying."""
        self.pub.close(linger=0)

    async def come_back(self) -> None:
        """Bind a new PUB socket on the same endpoint (the old one's port is freed
        by ZMQ's I/O thread, so the bind is retried until it is)."""

        def bound() -> bool:
            pub = self._context.socket(zmq.XPUB)
            try:
                pub.bind(self.endpoint)
            except zmq.ZMQError:
                pub.close(linger=0)
                return False
            self.pub = pub
            return True

        await eventually(bound, what="rebinding the PUB endpoint")

    async def publish(self, payload: bytes, *, live: bool = True) -> int:
        seq = self.next_seq
        self.next_seq += 1
        self.buffer.append((seq, payload))
        if live:
            await self.pub.send_multipart([TOPIC, seq.to_bytes(8, "big"), payload])
        return seq

    def restart(self) -> None:
        """A new engine: sequence numbers start over and the old buffer is gone."""
        self.next_seq = 0
        self.buffer.clear()

    async def _serve_replay(self) -> None:
        while True:
            client, _, start = await self.router.recv_multipart()
            first = int.from_bytes(start, "big")
            self.replay_requests.append(first)
            self.requested.set()
            await self.answering.wait()
            for seq, payload in list(self.buffer):
                if seq >= first:
                    head = [client, b""] + ([TOPIC] if self.topic_in_replay else [])
                    await self.router.send_multipart([*head, seq.to_bytes(8, "big"), payload])
            tail = [client, b""] + ([b""] if self.topic_in_replay else [])
            await self.router.send_multipart([*tail, END_SEQ, b""])

    async def aclose(self) -> None:
        self._server.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._server
        self.pub.close(linger=0)
        self.router.close(linger=0)


class Collector:
    def __init__(self) -> None:
        self.batches: list[EventBatch] = []
        self._changed = asyncio.Event()

    def __call__(self, replica_id: str, batch: EventBatch) -> None:
        assert replica_id == "r0"
        self.batches.append(batch)
        self._changed.set()

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[EventBatch]:
        async def reached() -> None:
            while len(self.batches) < count:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(reached(), timeout)
        return self.batches

    @property
    def seqs(self) -> list[int]:
        return [batch.seq for batch in self.batches]


@pytest.fixture
async def context() -> AsyncIterator[zmq.asyncio.Context]:
    ctx = zmq.asyncio.Context()
    yield ctx
    ctx.term()


@pytest.fixture
async def publisher(context: zmq.asyncio.Context) -> AsyncIterator[FakePublisher]:
    pub = FakePublisher(context)
    yield pub
    await pub.aclose()


def subscriber_for(
    publisher: FakePublisher,
    collector: Callable[[str, EventBatch], None],
    context: zmq.asyncio.Context,
    **config: Any,
) -> KVEventSubscriber:
    settings = SubscriberConfig(
        **{
            "replica_id": "r0",
            "endpoint": publisher.endpoint,
            "replay_endpoint": publisher.replay_endpoint,
            "topic": TOPIC.decode(),
            "replay_timeout": 1.0,
            **config,
        }
    )
    return KVEventSubscriber(settings, collector, context=context, wall_time=lambda: 123.0)


def is_synthetic_clear(batch: EventBatch) -> bool:
    return batch.seq == SYNTHETIC_SEQ and batch.events == (AllBlocksCleared(),)


async def joined(publisher: FakePublisher, subscriber: KVEventSubscriber) -> None:
    """The subscription reached the publisher and the start-up catch-up is over."""
    await publisher.wait_subscribed()
    await asyncio.wait_for(subscriber.caught_up.wait(), timeout=10)


async def test_batches_arrive_in_order_and_decoded(
    publisher: FakePublisher, context: zmq.asyncio.Context
) -> None:
    payloads = captured_payloads()
    collector = Collector()
    async with subscriber_for(publisher, collector, context) as subscriber:
        await joined(publisher, subscriber)
        for payload in payloads:
            await publisher.publish(payload)
        batches = await collector.wait_for(len(payloads))
    assert collector.seqs == list(range(len(payloads)))
    assert any(type(e).__name__ == "BlockRemoved" for b in batches for e in b.events)
    assert subscriber.stats.gaps == 0 and subscriber.stats.replayed == 0
    assert publisher.replay_requests == [0]  # the start-up catch-up found nothing


async def test_a_gap_is_filled_from_the_replay_socket(
    publisher: FakePublisher, context: zmq.asyncio.Context
) -> None:
    payloads = captured_payloads()[:5]
    collector = Collector()
    async with subscriber_for(publisher, collector, context) as subscriber:
        await joined(publisher, subscriber)
        await publisher.publish(payloads[0])
        await collector.wait_for(1)
        await publisher.publish(payloads[1], live=False)  # lost on the PUB socket
        await publisher.publish(payloads[2], live=False)
        await publisher.publish(payloads[3])
        await publisher.publish(payloads[4])
        await collector.wait_for(5)
    assert collector.seqs == [0, 1, 2, 3, 4]
    assert publisher.replay_requests == [0, 1]
    assert subscriber.stats.gaps == 1 and subscriber.stats.replayed == 2
    assert subscriber.stats.lost == 0


async def test_replay_without_topic_frame_is_read_too(context: zmq.asyncio.Context) -> None:
    publisher = FakePublisher(context, topic_in_replay=False)
    payloads = captured_payloads()[:3]
    collector = Collector()
    try:
        async with subscriber_for(publisher, collector, context) as subscriber:
            await joined(publisher, subscriber)
            await publisher.publish(payloads[0], live=False)
            await publisher.publish(payloads[1], live=False)
            await publisher.publish(payloads[2])
            await collector.wait_for(3)
    finally:
        await publisher.aclose()
    assert collector.seqs == [0, 1, 2]


async def test_a_late_subscriber_is_warm_before_any_new_event(
    publisher: FakePublisher, context: zmq.asyncio.Context
) -> None:
    payloads = captured_payloads()[:4]
    for payload in payloads[:3]:
        await publisher.publish(payload, live=False)  # published before anyone listened
    collector = Collector()
    async with subscriber_for(publisher, collector, context) as subscriber:
        await collector.wait_for(3)  # nothing new was published: this is the catch-up
        assert publisher.replay_requests == [0]
        assert subscriber.stats.received == 0 and subscriber.stats.catch_ups == 1
        await publisher.wait_subscribed()
        await publisher.publish(payloads[3])
        await collector.wait_for(4)
    assert collector.seqs == [0, 1, 2, 3]
    assert subscriber.stats.gaps == 0 and subscriber.stats.duplicates == 0


async def test_live_messages_the_catch_up_also_served_are_delivered_once(
    publisher: FakePublisher, context: zmq.asyncio.Context
) -> None:
    payloads = captured_payloads()[:3]
    publisher.answering.clear()
    collector = Collector()
    async with subscriber_for(publisher, collector, context) as subscriber:
        await publisher.wait_subscribed()
        await asyncio.wait_for(publisher.requested.wait(), timeout=10)
        # The catch-up is waiting for its answer; these two are queued on the live socket too.
        await publisher.publish(payloads[0])
        await publisher.publish(payloads[1])
        publisher.answering.set()
        await collector.wait_for(2)
        await publisher.publish(payloads[2])
        await collector.wait_for(3)
    assert collector.seqs == [0, 1, 2]
    assert subscriber.stats.replayed == 2 and subscriber.stats.duplicates == 2
    assert subscriber.stats.restarts == 0 and subscriber.stats.gaps == 0


async def test_a_reconnect_catches_up_on_what_was_missed_without_a_new_event(
    publisher: FakePublisher, context: zmq.asyncio.Context
) -> None:
    payloads = captured_payloads()[:3]
    collector = Collector()
    async with subscriber_for(publisher, collector, context, reconnect_ivl=0.05) as subscriber:
        await joined(publisher, subscriber)
        await publisher.publish(payloads[0])
        await collector.wait_for(1)
        publisher.go_away()
        await publisher.publish(payloads[1], live=False)  # while the subscriber was cut off
        await publisher.publish(payloads[2], live=False)
        await publisher.come_back()
        await collector.wait_for(3)
    assert collector.seqs == [0, 1, 2]
    assert publisher.replay_requests == [0, 1]
    assert subscriber.stats.catch_ups == 2 and subscriber.stats.gaps == 0


async def test_a_catch_up_without_an_answer_gives_up_and_follows_the_live_stream(
    publisher: FakePublisher, context: zmq.asyncio.Context
) -> None:
    publisher.answering.clear()  # the replay socket takes requests but never answers
    collector = Collector()
    async with subscriber_for(publisher, collector, context, replay_timeout=0.1) as subscriber:
        await joined(publisher, subscriber)
        await publisher.publish(captured_payloads()[0])
        await collector.wait_for(1)
    assert collector.seqs == [0]
    assert subscriber.stats.catch_ups == 1 and subscriber.stats.lost == 0


async def test_aclose_cancels_a_catch_up_waiting_for_its_answer(
    publisher: FakePublisher, context: zmq.asyncio.Context
) -> None:
    publisher.answering.clear()
    subscriber = subscriber_for(publisher, Collector(), context, replay_timeout=600.0)
    task = subscriber.start()
    await asyncio.wait_for(publisher.requested.wait(), timeout=10)
    await asyncio.wait_for(subscriber.aclose(), timeout=2)
    assert task.done() and not subscriber.caught_up.is_set()


async def test_resync_forgets_and_fetches_the_whole_buffer_again(
    publisher: FakePublisher, context: zmq.asyncio.Context
) -> None:
    payloads = captured_payloads()[:2]
    for payload in payloads:
        await publisher.publish(payload, live=False)
    collector = Collector()
    async with subscriber_for(publisher, collector, context) as subscriber:
        await collector.wait_for(2)
        await subscriber.resync()
        batches = await collector.wait_for(5)
    assert [b.seq for b in batches[:2]] == [0, 1]
    assert is_synthetic_clear(batches[2]) and [b.seq for b in batches[3:]] == [0, 1]
    assert publisher.replay_requests[-1] == 0


async def test_salted_blocks_from_vllm_bytes_match_salted_requests_only(
    publisher: FakePublisher, context: zmq.asyncio.Context
) -> None:
    """Real vLLM 0.32 events of salted chats, replayed to a late subscriber, into the index."""
    salted = json.loads((FIXTURES / "kv_events_salted.json").read_text(encoding="utf-8"))
    for payload in captured_payloads("kv_events_salted.json"):
        await publisher.publish(payload, live=False)
    index = PreciseIndex()
    index.set_model("r0", "qwen2-tiny")
    async with subscriber_for(
        publisher, lambda rid, batch: index.apply(rid, batch), context
    ) as sub:
        await asyncio.wait_for(sub.caught_up.wait(), timeout=10)
    second = salted["prompts"]["second"]

    def request(salt: str | None) -> list[int]:
        return block_hashes(second, 32, chain_seed("qwen2-tiny", salt))

    assert index.match(request("tenant-a"), now=0.0) == {"r0": 2}
    assert index.match(request("tenant-b"), now=0.0) == {"r0": 2}
    assert index.match(request(None), now=0.0) == {"r0": 1}  # only the unsalted chat's block 0
    assert index.match(request("tenant-c"), now=0.0) == {}


async def test_unrecoverable_loss_tells_the_consumer_to_forget(
    publisher: FakePublisher, context: zmq.asyncio.Context
) -> None:
    payloads = captured_payloads()[:4]
    collector = Collector()
    async with subscriber_for(publisher, collector, context) as subscriber:
        await joined(publisher, subscriber)
        await publisher.publish(payloads[0])
        await collector.wait_for(1)
        await publisher.publish(payloads[1], live=False)
        await publisher.publish(payloads[2], live=False)
        del publisher.buffer[1]  # the replay buffer rolled past seq 1
        await publisher.publish(payloads[3])
        batches = await collector.wait_for(4)
    assert batches[0].seq == 0
    assert is_synthetic_clear(batches[1]) and batches[1].timestamp == 123.0
    assert [b.seq for b in batches[2:]] == [2, 3]
    assert subscriber.stats.lost == 1


async def test_a_restarted_engine_clears_and_starts_over(
    publisher: FakePublisher, context: zmq.asyncio.Context
) -> None:
    payloads = captured_payloads()[:3]
    collector = Collector()
    async with subscriber_for(publisher, collector, context) as subscriber:
        await joined(publisher, subscriber)
        await publisher.publish(payloads[0])
        await publisher.publish(payloads[1])
        await collector.wait_for(2)
        publisher.restart()
        await publisher.publish(payloads[2])
        batches = await collector.wait_for(4)
    assert [b.seq for b in batches[:2]] == [0, 1]
    assert is_synthetic_clear(batches[2])
    assert batches[3].seq == 0 and batches[3].events
    assert subscriber.stats.restarts == 1


async def test_no_replay_endpoint_means_a_gap_is_lost(
    publisher: FakePublisher, context: zmq.asyncio.Context
) -> None:
    payloads = captured_payloads()[:3]
    collector = Collector()
    settings = SubscriberConfig(replica_id="r0", endpoint=publisher.endpoint, topic="kv")
    async with KVEventSubscriber(settings, collector, context=context) as subscriber:
        await joined(publisher, subscriber)
        assert subscriber.stats.catch_ups == 0
        await publisher.publish(payloads[0])
        await publisher.publish(payloads[1], live=False)
        await publisher.publish(payloads[2])
        batches = await collector.wait_for(3)
    assert batches[0].seq == 0 and is_synthetic_clear(batches[1]) and batches[2].seq == 2


async def test_a_failing_callback_does_not_stop_the_subscriber(
    publisher: FakePublisher, context: zmq.asyncio.Context
) -> None:
    payloads = captured_payloads()[:2]
    collector = Collector()

    def flaky(replica_id: str, batch: EventBatch) -> None:
        collector(replica_id, batch)
        if batch.seq == 0:
            raise RuntimeError("consumer bug")

    settings = SubscriberConfig(replica_id="r0", endpoint=publisher.endpoint, topic="kv")
    async with KVEventSubscriber(settings, flaky, context=context) as subscriber:
        await publisher.wait_subscribed()
        for payload in payloads:
            await publisher.publish(payload)
        await collector.wait_for(2)
    assert collector.seqs == [0, 1]
    assert subscriber.stats.callback_errors == 1


async def test_aclose_cancels_a_waiting_subscriber_promptly(
    publisher: FakePublisher, context: zmq.asyncio.Context
) -> None:
    subscriber = subscriber_for(publisher, Collector(), context)
    task = subscriber.start()
    await publisher.wait_subscribed()
    await asyncio.wait_for(subscriber.aclose(), timeout=2)
    assert task.done()


async def test_a_subscriber_with_its_own_context_cleans_up(publisher: FakePublisher) -> None:
    collector = Collector()
    settings = SubscriberConfig(replica_id="r0", endpoint=publisher.endpoint, topic="kv")
    async with KVEventSubscriber(settings, collector):
        await publisher.wait_subscribed()
        await publisher.publish(captured_payloads()[0])
        await collector.wait_for(1)
    assert collector.seqs == [0]
