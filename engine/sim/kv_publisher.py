"""ZMQ publisher of the simulated engine's KV-cache events (vLLM's protocol).

Wire protocol, as ``ZmqEventPublisher`` in ``vllm/distributed/kv_events.py``:

* PUB socket: every engine step that changed the cache is one multipart
  message ``[topic, seq, payload]``; ``seq`` counts batches from 0 as an
  8-byte big-endian integer; ``payload`` is msgpack of
  ``[ts, [event, ...], data_parallel_rank]`` (events as in
  ``engine.sim.events``).
* Replay buffer: the payload of each of the last ``buffer_steps`` batches
  (default 10,000, vLLM's ``KVEventsConfig.buffer_steps``) is kept with its
  seq, whether or not the PUB socket could send it.
* ROUTER replay socket: a DEALER sends ``[b"", start_seq]`` (8-byte
  big-endian); it receives ``[b"", topic, seq, payload]`` for every buffered
  batch with ``seq >= start_seq`` (payload byte-identical to the live one),
  then the end marker ``[b"", b"", -1 as signed 8-byte big-endian (ff..ff),
  b""]``; a start past the newest batch gets only the marker. A request that
  is not three frames (identity, empty, start) is logged and ignored. This is
  vLLM 0.32's ``_service_replay``; older vLLMs sent no topic frame. Replay
  requests are served between batches, in the same thread, so a reply is a
  consistent snapshot of the buffer.

All socket work happens in one background thread (ZMQ sockets are not
thread-safe); the engine loop only appends to a bounded queue with
``put_nowait`` and never blocks. When that queue is full the batch is dropped
and counted, as a PUB socket past its high-water mark would drop it anyway.
Sockets are bound in :meth:`start`, in the caller's thread, so a port that
is taken fails the start-up instead of a background thread.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable

import msgpack
import zmq

from engine.sim.events import CacheEvent, batch_to_wire

logger = logging.getLogger(__name__)

END_SEQ = (-1).to_bytes(8, "big", signed=True)
_IDLE_POLL_MS = 20


class KVEventPublisher:
    def __init__(
        self,
        endpoint: str,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        max_queue: int = 100_000,
        hwm: int = 100_000,
        wall_time: Callable[[], float] = time.time,
    ) -> None:
        self._endpoint = endpoint
        self._replay_endpoint = replay_endpoint
        self._topic = topic.encode("utf-8")
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._queue: queue.Queue[tuple[float, list[CacheEvent]] | None] = queue.Queue(
            maxsize=max_queue
        )
        self._hwm = hwm
        self._wall_time = wall_time
        self._context: zmq.Context[zmq.Socket[bytes]] | None = None
        self._pub: zmq.Socket[bytes] | None = None
        self._replay: zmq.Socket[bytes] | None = None
        self._thread: threading.Thread | None = None
        self.dropped_batches = 0
        self.published_batches = 0

    def start(self) -> None:
        context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        try:
            pub = context.socket(zmq.PUB)
            pub.set_hwm(self._hwm)
            pub.setsockopt(zmq.LINGER, 0)
            pub.bind(self._endpoint)
            replay = None
            if self._replay_endpoint is not None:
                replay = context.socket(zmq.ROUTER)
                replay.setsockopt(zmq.LINGER, 0)
                replay.bind(self._replay_endpoint)
        except zmq.ZMQError:
            context.destroy(linger=0)
            raise
        self._context, self._pub, self._replay = context, pub, replay
        self._thread = threading.Thread(target=self._run, name="sim-kv-events", daemon=True)
        self._thread.start()

    def publish(self, events: list[CacheEvent]) -> None:
        """Queue one batch; never blocks the caller."""
        try:
            self._queue.put_nowait((self._wall_time(), events))
        except queue.Full:
            self.dropped_batches += 1

    def close(self, timeout: float = 2.0) -> None:
        """Flush what is queued, stop the thread and close the sockets (blocking)."""
        if self._thread is None:
            return
        while True:
            try:
                self._queue.put(None, timeout=timeout)
                break
            except queue.Full:
                continue
        self._thread.join(timeout=timeout)
        self._thread = None
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None

    def _run(self) -> None:
        assert self._pub is not None
        pub, replay = self._pub, self._replay
        seq = 0
        while True:
            served = False
            if replay is not None and replay.poll(0):
                self._serve_replay(replay)
                served = True
            try:
                item = self._queue.get(timeout=0 if served else _IDLE_POLL_MS / 1000)
            except queue.Empty:
                continue
            if item is None:
                return
            timestamp, events = item
            payload = msgpack.packb(batch_to_wire(timestamp, events, 0))
            try:
                pub.send_multipart(
                    (self._topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK
                )
            except zmq.Again:
                self.dropped_batches += 1
            self._buffer.append((seq, payload))
            self.published_batches += 1
            seq += 1

    def _serve_replay(self, replay: zmq.Socket[bytes]) -> None:
        frames = replay.recv_multipart()
        if len(frames) != 3:
            logger.warning("invalid KV-event replay request with %d frames", len(frames))
            return
        client, _, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        for seq, payload in list(self._buffer):
            if seq >= start:
                replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        replay.send_multipart((client, b"", b"", END_SEQ, b""))
