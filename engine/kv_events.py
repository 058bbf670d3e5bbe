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
* ``BlockStored.extra_keys``: one entry per stored block, nil or an untagged
  array; a request's ``cache_salt`` is a string in the entry of its block 0
  (see :func:`cache_salt_of`), decoded into ``BlockStored.cache_salt``.
* Block hashes are unsigned 64-bit ints (or bytes when the engine runs with
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``); both are kept as they come.
* Replay: a DEALER connected to the ROUTER ``replay_endpoint`` sends
  ``[b"", start_seq as 8-byte big-endian]`` and receives ``[b"", topic, seq,
  payload]`` for every batch still in the engine's buffer (the last
  ``buffer_steps``, default 10,000) with ``seq >= start_seq``, then the end
  marker ``[b"", b"", -1 (8 bytes ff), b""]``. Older vLLMs leave the topic
  frame out; both forms are read.

Subscriber algorithm (:class:`KVEventSubscriber`, one per replica, on the
event loop with ``zmq.asyncio``):

1. Warm start. A monitor on the SUB socket reports every completed
   connection to the publisher: the first one at start-up, and each one
   after ZMQ reconnected by itself (engine restart, network blip) or after
   the socket was recreated. Each one triggers a *catch-up*: ask the replay
   socket for everything from ``last + 1`` (``0`` before anything was seen)
   and deliver it, so blocks a replica cached before we started (or while we
   were cut off) are known before it publishes anything new. A catch-up is
   bounded (``replay_timeout`` per reply, ``replay_limit`` in all); a
   replay socket that does not answer (engine still starting) leaves us
   where we were, and the gap logic of step 3 takes over.
2. Deliver each batch to ``on_batch(replica_id, batch)`` in sequence order,
   each at most once. The callback is synchronous and runs on the loop: it
   must be quick (the precise index's ``apply`` is). The catch-up runs
   inline, before the next live message is read, so replayed batches always
   come before live ones. Live messages that were already queued when the
   replay snapshot was taken come again afterwards: a live ``seq <= last``
   whose payload digest equals the replayed batch's is a duplicate and is
   dropped (``stats.duplicates``).
3. ``seq == last + 1``: deliver. ``seq > last + 1``: a gap -- ask the replay
   socket for ``last + 1`` onwards and deliver the missed batches before the
   live one (this also covers batches published between a catch-up's
   snapshot and the moment our subscription reached the publisher).
4. Batches that cannot be recovered (no replay endpoint, no answer within
   the timeouts, buffer already rolled past them, undecodable) leave the
   consumer's view unknowable, so it gets a synthetic batch with
   ``seq = -1`` and one ``AllBlocksCleared`` and relearns from there:
   forgetting is safer than routing to blocks that may be gone.
5. A live ``seq <= last`` that is not a duplicate means the engine
   restarted (its cache is empty): a synthetic clear, then the message is
   taken as a first one.
6. The SUB socket reconnects by itself (ZMQ reconnect interval
   ``reconnect_ivl``) and sends ZMTP heartbeats so a dead peer is noticed;
   socket errors close and recreate it after ``reconnect_ivl``.
   :meth:`KVEventSubscriber.resync` forgets everything and starts over
   from seq 0 (the gateway calls it when a replica it had written off as
   unhealthy comes back).

Known limit: a restart is recognised by the sequence going back. An engine
that restarted and published more batches than we had seen before we
reconnect looks like a continuation instead (the catch-up then serves the
new engine's batches); the subscriber usually reconnects long before a
restarted vLLM has loaded its model, so this needs a very short-lived outage.

``run()`` works until cancelled; ``start()`` + ``aclose()`` (or ``async
with``) wrap it in a task. Every wait (live messages, monitor events, replay
replies) is an ``await`` that cancellation ends at once; sockets are closed
on the way out. Nothing here blocks the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from array import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, cast

import msgpack
import xxhash
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from engine.tasks import cancel
from policies.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineHash,
    EventBatch,
    KVEvent,
)

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
    try:
        array("Q", value)  # the common case checked in C: unsigned 64-bit ints
    except (TypeError, OverflowError):
        return tuple(_hash(item) for item in value)  # bytes, or signed (older vLLM)
    return tuple(value)


def _token_ids(value: Any) -> tuple[int, ...]:
    # array() checks every element in C (a generator over a prefill's thousands of
    # ids was a third of decoding it), for what the block hashes take: [0, 2**32).
    if isinstance(value, list):
        try:
            array("I", value)
        except (TypeError, OverflowError):
            pass
        else:
            return tuple(value)
    raise KVEventDecodeError("token_ids is not a list of ints in [0, 2**32)")


def _optional(value: Any, kind: type) -> Any:
    if value is None or isinstance(value, kind):
        return value
    raise KVEventDecodeError(f"expected {kind.__name__} or nil, got {type(value).__name__}")


# Positional field order of the array form (older vLLM, ``array_like=True``).
_ARRAY_FIELDS = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name", "extra_keys"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
}  # fmt: skip


def cache_salt_of(extra_keys: Any, lora_name: str | None) -> str | None:
    """The ``cache_salt`` in a ``BlockStored``'s ``extra_keys``, if its first block has one.

    vLLM 0.32 (``to_event_extra_keys`` in ``vllm/v1/core/kv_cache_utils.py``)
    publishes one entry per stored block: nil, or an *untagged* array holding,
    in this order, the LoRA name (every block of a LoRA request), one
    ``[mm_identifier, offset]`` pair per multimodal input in the block, the
    cache salt (a string; only on a request's block 0, so only in
    ``extra_keys[0]`` of an event whose parent is nil) and the block's
    prompt-embedding digest (bytes). So the salt is the first string after the
    LoRA name. A tagged map ``{"type": "cache_salt", "salt": ...}`` (a typed
    schema some vLLM trees publish) is read too; other shapes mean "no salt".
    """
    if extra_keys is None:
        return None
    if not isinstance(extra_keys, list):
        raise KVEventDecodeError("extra_keys is not a list")
    first = extra_keys[0] if extra_keys else None
    if not isinstance(first, list):
        return None
    keys = first[1:] if lora_name is not None and first[:1] == [lora_name] else first
    for key in keys:
        if isinstance(key, str):
            return key
        if isinstance(key, dict) and key.get("type") == "cache_salt":
            salt = key.get("salt")
            return salt if isinstance(salt, str) else None
    return None


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
            token_ids = _token_ids(fields["token_ids"])
            block_size = fields["block_size"]
            if type(block_size) is not int:
                raise KVEventDecodeError("block_size is not an int")
            lora_name = _optional(fields.get("lora_name"), str)
            return BlockStored(
                block_hashes=_hashes(fields["block_hashes"]),
                parent_block_hash=None if parent is None else _hash(parent),
                token_ids=token_ids,
                block_size=block_size,
                lora_id=_optional(fields.get("lora_id"), int),
                medium=_optional(fields.get("medium"), str),
                lora_name=lora_name,
                cache_salt=cache_salt_of(fields.get("extra_keys"), lora_name),
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

# A completed ZMTP handshake: the publisher has our connection (and, right after,
# our subscription). Each one, the first included, triggers a catch-up.
CONNECTED_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED
_DRAIN = 256
"""Live messages handled per wake-up before monitor events get another look."""
_YIELD_EVERY = 256


_EVENTS, _POLLIN, _RCVMORE = int(zmq.EVENTS), int(zmq.POLLIN), int(zmq.RCVMORE)
"""As plain ints: ``zmq.POLLIN`` is a flag enum, and each ``&`` with it made one."""


def _readable(socket: zmq.Socket[bytes]) -> bool:
    """A message waits on ``socket`` (reading EVENTS also re-arms its descriptor)."""
    return bool(cast(int, socket.get(_EVENTS)) & _POLLIN)


def _receive(socket: zmq.Socket[bytes]) -> list[bytes]:
    """A whole message from a socket ``_readable`` said holds one: ``recv_multipart``
    without its Python layer (a message's frames all arrive together)."""
    frames = [socket.recv(zmq.NOBLOCK)]
    while socket.get(_RCVMORE):
        frames.append(socket.recv(zmq.NOBLOCK))
    return frames


def _digest(payload: bytes) -> int:
    return xxhash.xxh3_64_intdigest(payload)


@dataclass(frozen=True)
class SubscriberConfig:
    replica_id: str
    endpoint: str
    """PUB endpoint to connect to, e.g. ``tcp://127.0.0.1:5557``."""
    replay_endpoint: str | None = None
    topic: str = "kv"
    replay_timeout: float = 2.0
    """Seconds to wait for each replay reply before giving the rest up."""
    replay_limit: float = 30.0
    """Seconds one whole replay exchange may take (vLLM's full 10,000-batch
    buffer streams in well under this); what came until then is kept."""
    reconnect_ivl: float = 0.2
    heartbeat_ivl: float = 2.0


@dataclass
class SubscriberStats:
    received: int = 0
    delivered: int = 0
    replayed: int = 0
    catch_ups: int = 0
    """Replay exchanges started by a (re)connection (step 1), answered or not."""
    duplicates: int = 0
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
    caught_up: asyncio.Event = field(default_factory=asyncio.Event, init=False, repr=False)
    """Set once the first catch-up is over (whatever it found): the consumer is warm."""
    _task: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    _rank: int | None = field(default=None, init=False, repr=False)
    _replayed: dict[int, int] = field(default_factory=dict, init=False, repr=False)
    """seq -> payload digest of the batches the last catch-up delivered, until
    the live stream has passed them (step 2)."""

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

    async def resync(self) -> None:
        """Forget what was delivered and start over from seq 0 (if running).

        The consumer gets a synthetic clear, then the whole replay buffer
        again: for a consumer that dropped this replica's blocks on its own.
        """
        running = self._task is not None and not self._task.done()
        await self.aclose()
        self._forget()
        self.stats.last_seq = None
        self._replayed.clear()
        self.caught_up.clear()
        if running:
            self.start()

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
                sub = self._socket(context)
                monitor = sub.get_monitor_socket(CONNECTED_EVENTS)
                try:
                    sub.connect(self.config.endpoint)
                    await self._follow(context, sub, monitor)
                except zmq.ZMQError as exc:
                    self.stats.reconnects += 1
                    logger.warning("KV events of %s: %s; reconnecting", self.config.replica_id, exc)
                finally:
                    with contextlib.suppress(zmq.ZMQError):
                        sub.disable_monitor()
                    monitor.close(linger=0)
                    sub.close(linger=0)
                await asyncio.sleep(self.config.reconnect_ivl)  # back-off before a new socket
        finally:
            if own_context:
                context.term()

    def _socket(self, context: zmq.asyncio.Context) -> zmq.asyncio.Socket:
        sub = context.socket(zmq.SUB)
        sub.setsockopt(zmq.RECONNECT_IVL, int(self.config.reconnect_ivl * 1000))
        sub.setsockopt(zmq.RECONNECT_IVL_MAX, 5000)
        heartbeat_ms = int(self.config.heartbeat_ivl * 1000)
        sub.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ms)
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat_ms * 3)
        sub.setsockopt(zmq.SUBSCRIBE, self.config.topic.encode())
        return sub

    async def _follow(
        self, context: zmq.asyncio.Context, sub: zmq.asyncio.Socket, monitor: zmq.asyncio.Socket
    ) -> None:
        """Serve connection events (catch-ups) first, then live messages, forever.

        The two sockets are read without pyzmq's asyncio layer: a reader on each one's
        file descriptor wakes this task, and each message is taken by a plain
        non-blocking receive. With the layer's poller and futures a one-block message
        cost the loop 156 us of CPU, without them 91 (``python -m loadtest.kv_events_cost``),
        and a replica publishes a message every engine step.
        """
        loop = asyncio.get_running_loop()
        live: zmq.Socket[bytes] = zmq.Socket.shadow(sub.underlying)
        events: zmq.Socket[bytes] = zmq.Socket.shadow(monitor.underlying)
        wake = asyncio.Event()
        fds = [live.fileno(), events.fileno()]
        for fd in fds:
            loop.add_reader(fd, wake.set)
        try:
            while True:
                # A socket's descriptor only signals that its state may have changed;
                # EVENTS says whether a message is there (and re-arms the signal).
                if _readable(events):
                    event = parse_monitor_message(events.recv_multipart(zmq.NOBLOCK))
                    if event["event"] & CONNECTED_EVENTS:
                        await self._catch_up(context)
                    continue  # a catch-up changed what live messages mean: look again
                drained = 0
                while drained < _DRAIN and _readable(live):
                    # asked before each receive: a receive that finds nothing raises,
                    # and building that exception cost more than the look
                    drained += 1
                    try:
                        frames = _receive(live)
                    except zmq.Again:
                        break
                    await self._handle(context, frames)
                if drained == _DRAIN:
                    continue  # more may wait: monitor events get their look first
                wake.clear()
                if _readable(events) or _readable(live):
                    continue  # came between the looks above and the clear
                await wake.wait()
        finally:
            for fd in fds:
                loop.remove_reader(fd)

    # -- ordering ------------------------------------------------------------------------------

    async def _catch_up(self, context: zmq.asyncio.Context) -> None:
        """Step 1: deliver everything the replay buffer holds past what we have."""
        if self.config.replay_endpoint:
            self.stats.catch_ups += 1
            last = self.stats.last_seq
            await self._recover(context, 0 if last is None else last + 1, None)
        self.caught_up.set()

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
            if self._replayed.get(seq) == _digest(frames[2]):
                self.stats.duplicates += 1  # delivered by the catch-up already
                return
            self.stats.restarts += 1
            logger.warning(
                "KV events of %s restarted at seq %d (last %d)", self.config.replica_id, seq, last
            )
            self._forget()
            last = None
        self._replayed.clear()  # the live stream is past every replayed batch now
        expected = -1 if last is None else last
        if seq > expected + 1:
            self.stats.gaps += 1
            await self._recover(context, expected + 1, seq)
        self._accept(seq, frames[2])

    async def _recover(self, context: zmq.asyncio.Context, first: int, stop: int | None) -> None:
        """Deliver batches ``first .. stop - 1`` from the replay socket, or declare them lost.

        ``stop=None`` (a catch-up): whatever the buffer holds from ``first`` on.
        """
        recovered: dict[int, bytes] = {}
        if self.config.replay_endpoint:
            recovered = await self._replay(context, first, stop)
        catch_up = stop is None
        if stop is None:
            if not recovered:
                return  # nothing new (or no answer): the live stream will tell
            stop = max(recovered) + 1
        missing = [seq for seq in range(first, stop) if seq not in recovered]
        if missing:
            self.stats.lost += len(missing)
            logger.warning(
                "KV events of %s: %d batch(es) between seq %d and %d lost; clearing",
                self.config.replica_id, len(missing), first, stop - 1,
            )  # fmt: skip
            self._forget()
            first = missing[-1] + 1  # what follows the last hole is still worth knowing
        for count, seq in enumerate(range(first, stop), start=1):
            self.stats.replayed += 1
            if catch_up:
                self._replayed[seq] = _digest(recovered[seq])
            self._accept(seq, recovered[seq])
            if count % _YIELD_EVERY == 0:
                await asyncio.sleep(0)  # a catch-up may be 10,000 batches: let others run

    async def _replay(
        self, context: zmq.asyncio.Context, first: int, stop: int | None
    ) -> dict[int, bytes]:
        """One replay exchange: payloads with ``first <= seq < stop``, as far as they came."""
        assert self.config.replay_endpoint is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.replay_limit
        dealer = context.socket(zmq.DEALER)
        payloads: dict[int, bytes] = {}
        try:
            dealer.connect(self.config.replay_endpoint)
            await dealer.send_multipart([b"", first.to_bytes(8, "big")])
            while True:
                wait = min(self.config.replay_timeout, deadline - loop.time())
                if wait <= 0 or not await dealer.poll(max(1, int(wait * 1000))):
                    logger.info(
                        "KV-event replay from %s: no end marker after %d batch(es)",
                        self.config.replica_id, len(payloads),
                    )  # fmt: skip
                    break
                seq, payload = split_replay_reply(await dealer.recv_multipart())
                if seq < 0 or (stop is not None and seq >= stop):
                    break  # end marker, or the live stream has it from here on
                if seq >= first:
                    payloads[seq] = payload
                if len(payloads) % _YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # replies already queued do not yield by themselves
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
        """Tell the consumer to drop what it knows of this replica (see step 4 and 5)."""
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
