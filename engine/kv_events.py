"""Subscribe to a vLLM replica's KV-cache events and decode them.

Wire format (vLLM 0.32, ``vllm/distributed/kv_events.py``; fixtures and
notes in ``tests/fixtures/vllm/``):

* PUB socket, one multipart message per engine step that touched the cache:
  ``[topic, seq, payload]``. ``seq`` is an 8-byte big-endian counter from 0,
  per publisher (it restarts at 0 when the engine restarts).
* ``payload`` is msgpack ``[ts, [event, ...], data_parallel_rank]``.
* Each event is a msgpack *map* tagged by ``"type"`` (``BlockStored``,
  ``BlockRemoved``, ``AllBlocksCleared``), keys in declaration order, fields
  equal to their default left out. Older vLLMs sent each event as an array
  ``[tag, field, ...]``; :func:`decode_payload` reads both. Unknown event
  types are skipped (forward compatible); unknown keys are ignored.
* Block hashes are unsigned 64-bit ints (or bytes when the engine runs with
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``); both are kept as they come.
* Replay: a DEALER connected to the ROUTER ``replay_endpoint`` sends
  ``[b"", start_seq as 8-byte big-endian]`` and receives ``[b"", topic, seq,
  payload]`` for every buffered batch with ``seq >= start_seq``, then the end
  marker ``[b"", b"", -1 (8 bytes ff), b""]``. Older vLLMs (and our
  simulator) leave the topic frame out; both forms are read.

Subscriber algorithm (:class:`KVEventSubscriber`, one per replica, on the
event loop with ``zmq.asyncio``):

1. Deliver each batch to ``on_batch(replica_id, batch)`` in sequence order.
   The callback is synchronous and runs on the loop: it must be quick (the
   precise index's ``apply`` is).
2. ``seq == last + 1``: deliver. ``seq > last + 1``: a gap -- ask the replay
   socket for ``last + 1`` onwards and deliver the missed batches before the
   live one. The first message after start counts as following ``-1``, so a
   subscriber that starts late catches up on the engine's replay buffer.
3. Batches that cannot be recovered (no replay endpoint, no answer within
   ``replay_timeout``, buffer already rolled past them, undecodable) leave
   the consumer's view unknowable, so it gets a synthetic batch with
   ``seq = -1`` and one ``AllBlocksCleared`` and relearns from there:
   forgetting is safer than routing to blocks that may be gone.
4. ``seq <= last`` on the live socket means the engine restarted (its cache
   is empty): a synthetic clear, then the message is taken as a first one.
5. The SUB socket reconnects by itself (ZMQ reconnect interval
   ``reconnect_ivl``) and sends ZMTP heartbeats so a dead peer is noticed;
   socket errors close and recreate it after ``reconnect_ivl``.

Known limit: a restart is recognised by the sequence going back. An engine
that restarted and published more batches than we had seen before we
reconnect looks like a gap instead (replay then serves the new engine's
batches); the subscriber usually reconnects long before a restarted vLLM has
loaded its model, so this needs a very short-lived outage.

``run()`` works until cancelled; ``start()`` + ``aclose()`` (or ``async
with``) wrap it in a task. Nothing here blocks the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self

import msgpack
import zmq
import zmq.asyncio

from policies.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineHash,
    EventBatch,
    KVEvent,
)

from .tasks import cancel

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
SYNTHETIC_SEQ = -1

OnBatch = Callable[[str, EventBatch], None]


class KVEventDecodeError(ValueError):
    """A message that is not a vLLM KV-event batch."""


# -- decoding ------------------------------------------------------------------------------------


def _hash(value: Any) -> EngineHash:
    if isinstance(value, (int, bytes)) and not isinstance(value, bool):
        return value
    raise KVEventDecodeError(f"block hash of type {type(value).__name__}")


def _hashes(value: Any) -> tuple[EngineHash, ...]:
    if not isinstance(value, list):
        raise KVEventDecodeError("block_hashes is not a list")
    return tuple(_hash(item) for item in value)


def _optional(value: Any, kind: type) -> Any:
    if value is None or isinstance(value, kind):
        return value
    raise KVEventDecodeError(f"expected {kind.__name__} or nil, got {type(value).__name__}")


# Positional field order of the array form (older vLLM, ``array_like=True``).
_ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}  # fmt: skip


def decode_event(raw: Any) -> KVEvent | None:
    """One event (map or array form); ``None`` for an event type we do not know."""
    if isinstance(raw, dict):
        kind, fields = raw.get("type"), raw
    elif isinstance(raw, list) and raw and isinstance(raw[0], str):
        kind = raw[0]
        fields = dict(zip(_ARRAY_FIELDS.get(kind, ()), raw[1:]))
    else:
        raise KVEventDecodeError(f"event is a {type(raw).__name__}, not a tagged map or array")
    try:
        if kind == "BlockStored":
            parent = fields.get("parent_block_hash")
            token_ids = fields["token_ids"]
            if not isinstance(token_ids, list) or not all(type(t) is int for t in token_ids):
                raise KVEventDecodeError("token_ids is not a list of ints")
            block_size = fields["block_size"]
            if type(block_size) is not int:
                raise KVEventDecodeError("block_size is not an int")
            return BlockStored(
                block_hashes=_hashes(fields["block_hashes"]),
                parent_block_hash=None if parent is None else _hash(parent),
                token_ids=tuple(token_ids),
                block_size=block_size,
                lora_id=_optional(fields.get("lora_id"), int),
                medium=_optional(fields.get("medium"), str),
            )
        if kind == "BlockRemoved":
            return BlockRemoved(
                block_hashes=_hashes(fields["block_hashes"]),
                medium=_optional(fields.get("medium"), str),
            )
    except KeyError as missing:
        raise KVEventDecodeError(f"{kind} without {missing}") from None
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def decode_payload(payload: bytes, seq: int = SYNTHETIC_SEQ) -> EventBatch:
    """A msgpack ``[ts, [events], dp_rank]`` payload as an :class:`EventBatch`."""
    try:
        raw = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise KVEventDecodeError(f"not msgpack: {exc}") from None
    if not isinstance(raw, list) or len(raw) not in (2, 3):
        raise KVEventDecodeError("payload is not [ts, events, dp_rank]")
    timestamp, events = raw[0], raw[1]
    rank = raw[2] if len(raw) == 3 else None
    if not isinstance(timestamp, (int, float)) or not isinstance(events, list):
        raise KVEventDecodeError("payload is not [ts, events, dp_rank]")
    decoded = tuple(event for event in map(decode_event, events) if event is not None)
    return EventBatch(
        seq=seq,
        timestamp=float(timestamp),
        events=decoded,
        data_parallel_rank=_optional(rank, int),
    )


def decode_seq(frame: bytes) -> int:
    if len(frame) != 8:
        raise KVEventDecodeError(f"sequence frame of {len(frame)} bytes")
    return int.from_bytes(frame, "big", signed=True)


def decode_message(frames: Sequence[bytes]) -> EventBatch:
    """A live ``[topic, seq, payload]`` message."""
    if len(frames) != 3:
        raise KVEventDecodeError(f"message with {len(frames)} frames, expected 3")
    return decode_payload(frames[2], decode_seq(frames[1]))


def split_replay_reply(frames: Sequence[bytes]) -> tuple[int, bytes]:
    """``(seq, payload)`` of one reply on a DEALER; ``seq == -1`` marks the end."""
    parts = list(frames[1:]) if frames and frames[0] == b"" else list(frames)
    if len(parts) == 3:  # vLLM 0.32: topic, seq, payload
        parts = parts[1:]
    if len(parts) != 2:
        raise KVEventDecodeError(f"replay reply with {len(frames)} frames")
    return decode_seq(parts[0]), parts[1]


# -- subscribing ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubscriberConfig:
    replica_id: str
    endpoint: str
    """PUB endpoint to connect to, e.g. ``tcp://127.0.0.1:5557``."""
    replay_endpoint: str | None = None
    topic: str = "kv"
    replay_timeout: float = 2.0
    """Seconds to wait for each replay reply before giving the gap up as lost."""
    reconnect_ivl: float = 0.2
    heartbeat_ivl: float = 2.0


@dataclass
class SubscriberStats:
    received: int = 0
    delivered: int = 0
    replayed: int = 0
    gaps: int = 0
    lost: int = 0
    restarts: int = 0
    decode_errors: int = 0
    callback_errors: int = 0
    reconnects: int = 0
    last_seq: int | None = None


@dataclass
class KVEventSubscriber:
    """Follows one replica's KV events; see the module docstring for the algorithm."""

    config: SubscriberConfig
    on_batch: OnBatch
    context: zmq.asyncio.Context | None = None
    wall_time: Callable[[], float] = time.time
    stats: SubscriberStats = field(default_factory=SubscriberStats)
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _rank: int | None = field(default=None, init=False, repr=False)

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self.run(), name=f"kv-events-{self.config.replica_id}"
            )
        return self._task

    async def aclose(self) -> None:
        task, self._task = self._task, None
        await cancel(task)

    async def __aenter__(self) -> Self:
        self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def run(self) -> None:
        """Receive, order and deliver batches until cancelled."""
        own_context = self.context is None
        context = zmq.asyncio.Context() if own_context else self.context
        assert context is not None
        try:
            while True:
                sub = self._subscribe(context)
                try:
                    while True:
                        frames = await sub.recv_multipart()
                        await self._handle(context, frames)
                except zmq.ZMQError as exc:
                    self.stats.reconnects += 1
                    logger.warning("KV events of %s: %s; reconnecting", self.config.replica_id, exc)
                finally:
                    sub.close(linger=0)
                await asyncio.sleep(self.config.reconnect_ivl)
        finally:
            if own_context:
                context.term()

    def _subscribe(self, context: zmq.asyncio.Context) -> zmq.asyncio.Socket:
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.RECONNECT_IVL, int(self.config.reconnect_ivl * 1000))
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
        heartbeat_ms = int(self.config.heartbeat_ivl * 1000)
        sub.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ms)
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat_ms * 3)
        sub.setsockopt(zmq.SUBSCRIBE, self.config.topic.encode())
        sub.connect(self.config.endpoint)
        return sub

    # -- ordering ------------------------------------------------------------------------------

    async def _handle(self, context: zmq.asyncio.Context, frames: list[bytes]) -> None:
        self.stats.received += 1
        try:
            seq = decode_seq(frames[1]) if len(frames) == 3 else None
            if seq is None:
                raise KVEventDecodeError(f"message with {len(frames)} frames, expected 3")
        except KVEventDecodeError as exc:
            self._decode_failed(exc)
            return
        last = self.stats.last_seq
        if last is not None and seq <= last:
            self.stats.restarts += 1
            logger.warning(
                "KV events of %s restarted at seq %d (last %d)", self.config.replica_id, seq, last
            )
            self._forget()
            last = None
        expected = -1 if last is None else last
        if seq > expected + 1:
            self.stats.gaps += 1
            await self._recover(context, expected + 1, seq)
        self._accept(seq, frames[2])

    async def _recover(self, context: zmq.asyncio.Context, first: int, live_seq: int) -> None:
        """Deliver batches ``first .. live_seq - 1`` from the replay socket, or declare them lost."""
        recovered: dict[int, bytes] = {}
        if self.config.replay_endpoint:
            recovered = await self._replay(context, first, live_seq)
        missing = [seq for seq in range(first, live_seq) if seq not in recovered]
        if missing:
            self.stats.lost += len(missing)
            logger.warning(
                "KV events of %s: %d batch(es) between seq %d and %d lost; clearing",
                self.config.replica_id, len(missing), first, live_seq - 1,
            )  # fmt: skip
            self._forget()
            first = missing[-1] + 1  # what follows the last hole is still worth knowing
        for count, seq in enumerate(range(first, live_seq), start=1):
            self.stats.replayed += 1
            self._accept(seq, recovered[seq])
            if count % 256 == 0:
                await asyncio.sleep(0)  # a catch-up may be 10,000 batches: let others run

    async def _replay(
        self, context: zmq.asyncio.Context, first: int, stop: int
    ) -> dict[int, bytes]:
        assert self.config.replay_endpoint is not None
        dealer = context.socket(zmq.DEALER)
        payloads: dict[int, bytes] = {}
        try:
            dealer.connect(self.config.replay_endpoint)
            await dealer.send_multipart([b"", first.to_bytes(8, "big")])
            timeout_ms = int(self.config.replay_timeout * 1000)
            while await dealer.poll(timeout_ms):
                seq, payload = split_replay_reply(await dealer.recv_multipart())
                if seq < 0 or seq >= stop:
                    break  # end marker, or the live stream has it from here on
                payloads[seq] = payload
        except (KVEventDecodeError, zmq.ZMQError) as exc:
            logger.warning("KV-event replay from %s failed: %s", self.config.replica_id, exc)
        finally:
            dealer.close(linger=0)
        return payloads

    def _accept(self, seq: int, payload: bytes) -> None:
        self.stats.last_seq = seq
        try:
            batch = decode_payload(payload, seq)
        except KVEventDecodeError as exc:
            self._decode_failed(exc)
            return
        self._rank = batch.data_parallel_rank
        self._deliver(batch)

    def _decode_failed(self, exc: KVEventDecodeError) -> None:
        self.stats.decode_errors += 1
        logger.error("undecodable KV event from %s: %s", self.config.replica_id, exc)
        self._forget()

    def _forget(self) -> None:
        """Tell the consumer to drop what it knows of this replica (see step 3 and 4)."""
        clear = EventBatch(
            seq=SYNTHETIC_SEQ,
            timestamp=self.wall_time(),
            events=(AllBlocksCleared(),),
            data_parallel_rank=self._rank,
        )
        self._deliver(clear)

    def _deliver(self, batch: EventBatch) -> None:
        try:
            self.on_batch(self.config.replica_id, batch)
        except Exception:
            self.stats.callback_errors += 1
            logger.exception("KV-event callback failed for %s", self.config.replica_id)
        else:
            self.stats.delivered += 1
