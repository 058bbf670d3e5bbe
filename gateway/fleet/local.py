"""The worker processes of one gateway (``prefixgate serve --workers N``) route as one.

The supervisor (``gateway.server.workers``) runs a :class:`Hub` on a Unix
socket in a private folder; each worker connects to it with a
:class:`LocalSync`, the same sharing of routing state as between gateway
instances through Redis (``gateway.fleet.shared``), carried in-host:

* **Batches.** A worker's batch (what its policy learned from a first byte,
  its in-flight requests per replica, and, here only, each request's way
  there: sent, or failed before its first byte) goes to the hub, which hands
  it at once to every other worker, as it came (the hub does not decode it),
  and keeps it in a bounded window that becomes the journal only when a
  worker starts. A worker writes what one turn of its event loop produced at the
  end of that turn (not after Redis's 5 ms flush), with its in-flight count
  when it changed: a sibling's prefix is pending for a worker, and its
  queued prefill priced, about as soon as it was sent.
* **Start.** A worker that connects (the first ones, or one that replaced a
  worker that died) gets the journal as a snapshot first, so a restarted
  worker starts from what the others know. The hub folds the window of
  batches into the journal then (``JOURNAL_WINDOW_BYTES`` of the latest
  batches, a few thousand requests), not as each batch passes: decoding
  every batch to keep the journal up to date was about a third of the hub's
  CPU, for a journal read only when a worker starts.
* **Claims.** Two workers taking the first requests of a burst of one new
  prefix at the same moment (the kernel splits the connections) would each
  place it before hearing of the other. So a worker about to send a prompt
  that no replica holds or awaits asks the hub first: the first worker's
  choice for that prefix (its first KV block) stands for ``CLAIM_SECONDS``,
  and every other worker sends there too. The hub also places what the
  workers cannot see yet: two *different* new prefixes claimed for the same
  replica by two workers within ``UNSEEN_SECONDS`` (each decided before
  hearing of the other's) would queue two prefills on one replica while
  another idles, so the later claim goes to the first of its worker's next
  choices that no other worker claimed that recently (one
  process, deciding them one after the other, would have priced the first
  one's prefill). It costs a round trip of a few hundred microseconds, only
  on such prompts; past ``CLAIM_WAIT_SECONDS`` without an answer the worker
  keeps its own choice, and claims nothing for ``CLAIM_BACKOFF_SECONDS``.
* **A worker that goes.** Its connection closes; the hub tells the others
  that its in-flight count is zero (they stop adding its requests at once).
* **Metrics and the ops view.** ``/metrics`` lands on whichever worker
  accepted the connection; that worker asks the hub, the hub asks every
  worker for its exposition and merges them (``gateway.ops.worker_metrics``:
  each series with a ``worker`` label), so one scrape sees the whole gateway.
  Each worker's ops sampler gathers every worker's compact readings the same
  way and adds them up (``gateway.ops.worker_readings``).

Frames on the socket: one kind byte, a 4-byte big-endian length, the
payload. ``H`` hello (the worker's index); ``B`` a batch
(``gateway.fleet.codec``); ``S`` the snapshot; ``C`` a worker's claim (a
4-byte id, the prefix's 8 bytes, its choice of replica and its next choices,
NUL-separated) and ``K`` the hub's answer (the id, the replica that stands);
``G`` a worker asks for a gather (a 4-byte id, the oldest gather it takes in
milliseconds, ``m`` metrics or ``r`` readings), ``Q`` the hub asks each
worker for its own (gather id, what), ``M`` a worker's answer (gather id,
its text or readings), ``A`` the gather to the asking worker (the id, the
merged text or the list of readings).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import struct
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import msgpack

from engine.pool.replicas import ReplicaPool
from engine.tasks import cancel
from gateway.fleet.codec import (
    BadPayload,
    Entry,
    Load,
    Pending,
    Routed,
    decode_batch,
    decode_snapshot,
    encode_batch,
    encode_snapshot,
)
from gateway.fleet.journal import Journal
from gateway.fleet.shared import FleetOptions, SharedRouting
from gateway.ops.worker_metrics import merge_expositions
from gateway.ops.worker_readings import Readings, merge_readings
from policies.base import Policy

log = logging.getLogger("prefixgate.workers")

LOCAL_OPTIONS = FleetOptions(flush_seconds=0.001, load_tick_seconds=0.02,
                             heartbeat_seconds=1.0, load_ttl_seconds=3.0,
                             startup_sync_seconds=3.0)
"""In-host: a batch leaves within a millisecond with the in-flight counts when they
changed; a count that changed with nothing to send (a request ended) leaves 20 ms later."""

CLAIM_SECONDS = 2.0
"""How long a worker's choice for a new prefix stands: past its first byte the others
have learned where it is (a first byte takes longer only on a replica far behind)."""
CLAIM_WAIT_SECONDS = 0.02
"""A worker waits this long for the hub's answer to a claim, then keeps its choice."""
CLAIM_BACKOFF_SECONDS = 1.0
"""After a claim the hub did not answer in time, a worker claims nothing for this long
(its new prefixes are placed one at a time: a slow hub would queue them)."""
UNSEEN_SECONDS = 0.05
"""A sibling's claim this recent may not have reached a worker yet (its entries travel
through the hub at the end of its loop's turn; a burst keeps both loops busy)."""
MAX_CLAIMS = 100_000
MAX_FRAME = 64 << 20
GATHER_SECONDS = 2.0
"""How long the hub waits for the workers' expositions (a stuck one is left out)."""
METRICS = b"m"
READINGS = b"r"
"""What a gather collects: ``/metrics`` texts, merged by the hub, or ops readings, added up
by the asking worker."""
SAMPLER_MAX_AGE_SECONDS = 1.0
"""A merge this young answers an ops sampler's ask (every worker's asks every 2 s: about
one merge a second, however many workers); a scrape takes none older than itself."""
READ_BYTES = 1 << 18
"""What one read of the hub's socket takes at most."""
JOURNAL_WINDOW_BYTES = 8 << 20
"""The hub keeps the latest batches up to this many bytes for the journal (a 2,048-token
prompt's two entries take about 2 KiB: some 4,000 requests); older ones are dropped unread."""
FOLD_CHUNK = 256
"""Batches folded into the journal between two turns of the hub's loop."""
WRITE_BUFFER_LIMIT = 16 << 20
"""A worker that does not read: frames to it are dropped past this many queued bytes."""

_HEADER = struct.Struct(">cI")
_ID = struct.Struct(">I")
_CLAIM = struct.Struct(">IQ")
_SEP = b"\0"
"""Between the replica ids of a claim: the worker's choice, then its next choices."""


def frame(kind: bytes, payload: bytes) -> bytes:
    return _HEADER.pack(kind, len(payload)) + payload


async def read_frames(reader: asyncio.StreamReader) -> AsyncIterator[tuple[bytes, bytes]]:
    """Every frame, as it comes: what one read brings is split into its frames (one
    await a read, not two a frame); ``IncompleteReadError`` at the end."""
    buffer = bytearray()
    while True:
        data = await reader.read(READ_BYTES)
        if not data:
            raise asyncio.IncompleteReadError(bytes(buffer), None)
        buffer += data
        start = 0
        while len(buffer) - start >= _HEADER.size:
            kind, size = _HEADER.unpack_from(buffer, start)
            if size > MAX_FRAME:
                raise BadPayload(f"a {size}-byte frame")
            end = start + _HEADER.size + size
            if end > len(buffer):
                break
            yield kind, bytes(buffer[start + _HEADER.size:end])
            start = end
        del buffer[:start]


# -- the supervisor's side -----------------------------------------------------------


@dataclass(eq=False)
class _Worker:
    writer: asyncio.StreamWriter
    index: int | None = None
    instance: str | None = None

    def send(self, data: bytes) -> None:
        """Unless it is gone, or not reading (its buffer past ``WRITE_BUFFER_LIMIT``)."""
        if not self.writer.is_closing() \
                and self.writer.transport.get_write_buffer_size() <= WRITE_BUFFER_LIMIT:
            self.writer.write(data)


@dataclass
class _Gather:
    expected: set[_Worker]
    texts: dict[int, bytes] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class Hub:
    """Relays every worker's batches to the others; keeps a journal for new workers."""

    def __init__(self, path: str, *, blocks_per_replica: int = 16_384,
                 window_bytes: int = JOURNAL_WINDOW_BYTES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.clock = clock
        self.window_bytes = window_bytes
        self._journal = Journal(blocks_per_replica=blocks_per_replica)
        self._window: deque[tuple[float, bytes]] = deque()
        """Batches not yet in the journal, oldest first, with when they came."""
        self._window_held = 0
        """Bytes of the batches in the window."""
        self._folding = asyncio.Lock()
        self.workers: set[_Worker] = set()
        self._gathers: dict[int, _Gather] = {}
        self._ids = itertools.count(1)
        self._claims: OrderedDict[int, tuple[str, float]] = OrderedDict()
        """New prefixes' first choices, oldest first: prefix -> (replica, when)."""
        self._placed: dict[str, tuple[float, object]] = {}
        """Each replica's latest new prefix: when, and for which worker."""
        self._merge: dict[bytes, asyncio.Future[bytes]] = {}
        self._merged_at: dict[bytes, float] = {}
        self._server: asyncio.AbstractServer | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, self.path,
                                                       limit=MAX_FRAME)
        os.chmod(self.path, 0o600)

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for worker in list(self.workers):
            worker.writer.close()
        for merge in self._merge.values():
            merge.cancel()
        await cancel(*self._tasks)

    @property
    def journal(self) -> Journal:
        """What the workers learned: the window folded in."""
        self._fold(len(self._window))
        return self._journal

    def _keep(self, payload: bytes, now: float) -> None:
        self._window.append((now, payload))
        self._window_held += len(payload)
        while self._window_held > self.window_bytes and len(self._window) > 1:
            self._window_held -= len(self._window.popleft()[1])

    def _fold(self, count: int) -> None:
        """The window's ``count`` oldest batches into the journal, each at the time it came."""
        window, journal = self._window, self._journal
        for _ in range(min(count, len(window))):
            now, payload = window.popleft()
            self._window_held -= len(payload)
            try:
                batch = decode_batch(payload)
            except BadPayload:
                continue
            for entry in batch.entries:
                if isinstance(entry, Routed):
                    journal.routed(entry.replica_id, entry.block_hashes, entry.session_key, now)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        worker = _Worker(writer)
        try:
            async with self._folding:  # a chunk at a time: the others' batches still pass
                while len(self._window) > FOLD_CHUNK:
                    self._fold(FOLD_CHUNK)
                    await asyncio.sleep(0)
            # What came meanwhile, the snapshot and joining the relay: no await between
            # them, so every batch is in the snapshot or reaches the worker after it.
            snapshot = self.journal.snapshot("0-0", self.clock(), time.time())
            worker.send(frame(b"S", encode_snapshot(snapshot)))
            self.workers.add(worker)
            async for kind, payload in read_frames(reader):
                self._handle(worker, kind, payload)
        except (asyncio.IncompleteReadError, ConnectionError, BadPayload, ValueError,
                struct.error):
            pass  # gone, or not one of ours: its connection ends
        finally:
            self.workers.discard(worker)
            writer.close()
            if worker.instance is not None:  # the others stop counting its requests
                gone = frame(b"B", encode_batch(worker.instance, [Load({})]))
                for other in self.workers:
                    other.send(gone)
            for gather in self._gathers.values():
                gather.expected.discard(worker)
                if not gather.expected:
                    gather.done.set()

    def _handle(self, worker: _Worker, kind: bytes, payload: bytes) -> None:
        if kind == b"B":
            if worker.instance is None:  # its first batch: who it is, for when it goes
                try:
                    worker.instance = decode_batch(payload).instance
                except BadPayload:
                    return  # not one of ours: nothing to relay
            self._keep(payload, self.clock())
            data = frame(b"B", payload)
            for other in self.workers:
                if other is not worker:
                    other.send(data)
        elif kind == b"C":
            claim_id, prefix = _CLAIM.unpack_from(payload)
            choice, *fallbacks = (name.decode(errors="replace")
                                  for name in payload[_CLAIM.size:].split(_SEP))
            worker.send(frame(b"K", _ID.pack(claim_id) + self.claim(
                prefix, choice, fallbacks, worker).encode()))
        elif kind == b"H":
            worker.index = int(payload.decode())
        elif kind == b"G":
            max_age = int.from_bytes(payload[_ID.size:_ID.size + 4] or b"\0", "big") / 1000
            what = payload[_ID.size + 4:_ID.size + 5] or METRICS
            task = asyncio.create_task(self._gather(worker, payload[:_ID.size], max_age, what))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif kind == b"M":
            (gather_id,) = _ID.unpack(payload[:_ID.size])
            gather = self._gathers.get(gather_id)
            if gather is not None and worker in gather.expected:
                gather.expected.discard(worker)
                gather.texts[worker.index if worker.index is not None else -1] = \
                    payload[_ID.size:]
                if not gather.expected:
                    gather.done.set()

    def claim(self, prefix: int, replica_id: str, fallbacks: Sequence[str] = (),
              worker: object = None) -> str:
        """The replica that stands for a new prefix: the first claimed within
        ``CLAIM_SECONDS``; else ``replica_id``, unless another worker placed a new prefix
        there within ``UNSEEN_SECONDS``: then the first of ``fallbacks`` (the claiming
        worker's next choices, best first) that no other worker did. What is returned
        now stands."""
        now = self.clock()
        claims = self._claims
        while claims and (len(claims) > MAX_CLAIMS
                          or next(iter(claims.values()))[1] < now - CLAIM_SECONDS):
            claims.popitem(last=False)
        held = claims.get(prefix)
        if held is not None:
            return held[0]

        def unseen(replica: str) -> bool:
            placed = self._placed.get(replica)
            return placed is not None and placed[1] is not worker \
                and now - placed[0] < UNSEEN_SECONDS

        if unseen(replica_id):
            replica_id = next((r for r in fallbacks if not unseen(r)), replica_id)
        claims[prefix] = (replica_id, now)
        self._placed[replica_id] = (now, worker)
        return replica_id

    async def _gather(self, asking: _Worker, request_id: bytes, max_age: float,
                      what: bytes) -> None:
        """Every worker's ``what`` to ``asking``: gathered at most ``max_age`` seconds ago,
        else anew (asks that come while it runs share it)."""
        merge = self._merge.get(what)
        if merge is None or (merge.done() and
                             self.clock() - self._merged_at.get(what, 0.0) > max_age):
            merge = self._merge[what] = asyncio.ensure_future(self._merge_all(what))
        try:
            merged = await asyncio.shield(merge)
        except ValueError:  # a text that does not parse: the asking worker times out
            self._merge.pop(what, None)
            return
        asking.send(frame(b"A", request_id + merged))

    async def _merge_all(self, what: bytes) -> bytes:
        gather_id = next(self._ids)
        gather = _Gather(set(self.workers))
        self._gathers[gather_id] = gather
        query = frame(b"Q", _ID.pack(gather_id) + what)
        for worker in list(gather.expected):
            worker.send(query)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(gather.done.wait(), GATHER_SECONDS)
        finally:
            del self._gathers[gather_id]
        if what == METRICS:
            merged = await asyncio.to_thread(merge_expositions, gather.texts)
        else:  # the asking worker adds the readings up (gateway.ops.worker_readings)
            merged = msgpack.packb([gather.texts[index] for index in sorted(gather.texts)])
        self._merged_at[what] = self.clock()
        return merged


# -- a worker's side -----------------------------------------------------------------


class Acceptor(Protocol):
    """What the metrics read of a worker's acceptor (``gateway.server.balance``)."""

    count: int
    deferred: int
    overdue: int
    shed: int


@dataclass
class Connections:
    """Where a worker's acceptor is, once its server has started one."""

    acceptor: Acceptor | None = None


@dataclass(frozen=True)
class WorkerRole:
    """This process is worker ``index`` of a gateway whose supervisor's hub is at ``hub``."""

    index: int
    hub: str
    connections: Connections = field(default_factory=Connections)


def siblings_of(worker: WorkerRole | None, pool: ReplicaPool, policy: Policy,
                exposition: Callable[[], bytes], readings: Callable[[], bytes], *,
                share_routing: bool) -> LocalSync | None:
    """The other workers of this gateway, or None when it runs as one process."""
    if worker is None:
        return None
    return LocalSync(worker.hub, worker.index, pool, policy, exposition, readings,
                     share_routing=share_routing)


class LocalSync(SharedRouting):
    """One worker's routing state, shared with its siblings through the hub (with
    ``share_routing`` off, Redis shares it and the hub only merges metrics)."""

    send_errors = (OSError, ConnectionError, RuntimeError)

    def __init__(self, path: str, index: int, pool: ReplicaPool, policy: Policy,
                 exposition: Callable[[], bytes], readings: Callable[[], bytes], *,
                 share_routing: bool = True,
                 options: FleetOptions = LOCAL_OPTIONS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(f"worker-{index}-{os.getpid()}", pool, policy, options=options,
                         clock=clock)
        self.path = path
        self.index = index
        self.share_routing = share_routing
        self.shares_pending = share_routing  # siblings follow each other's bursts
        self.exposition = exposition
        """This worker's own ``/metrics`` text, for the hub's merge."""
        self.readings = readings
        """This worker's own ops readings (``gateway.ops.worker_readings``), compact."""
        self._writer: asyncio.StreamWriter | None = None
        self._answers: dict[int, asyncio.Future[bytes]] = {}
        self._outbox: list[Entry] = []
        self.claims = self.claims_followed = self.claims_unanswered = 0
        self._unanswered_at = -CLAIM_BACKOFF_SECONDS
        self._ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []
        if share_routing:
            self.watch_inflight()

    def status(self) -> dict[str, object]:
        return {"worker": self.index, "up": self.up,
                "shared_through": "hub" if self.share_routing else "redis",
                "peers": self.peers()}

    async def start(self) -> None:
        """Connect, learn what the siblings know (the hub's snapshot), then run."""
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_unix_connection(self.path, limit=MAX_FRAME),
                self.options.startup_sync_seconds)
            self._writer = writer
            writer.write(frame(b"H", str(self.index).encode()))
            frames = read_frames(reader)
            kind, payload = await asyncio.wait_for(anext(frames),
                                                   self.options.startup_sync_seconds)
            if kind == b"S" and self.share_routing:
                self._learn_snapshot(decode_snapshot(payload), 0.0)
            self.up = True
        except (OSError, TimeoutError, asyncio.IncompleteReadError, BadPayload) as exc:
            log.warning("worker %d: the supervisor's hub (%s) is not there (%s): routing on "
                        "this worker's own state", self.index, self.path, exc)
            return
        self._tasks = [asyncio.create_task(self._read_loop(frames), name="workers-read")]
        if self.share_routing:
            self._tasks.append(asyncio.create_task(self._publish_loop(), name="workers-publish"))

    async def aclose(self) -> None:
        await cancel(*self._tasks)
        self._tasks.clear()
        self._stop_load_tick()
        if self._writer is not None:
            self._writer.close()
        for answer in self._answers.values():
            answer.cancel()

    async def gather_metrics(self, max_age: float = 0.0) -> bytes | None:
        """Every worker's metrics, merged by the hub (a merge at most ``max_age`` seconds
        old); None without a hub."""
        return await self._gather(METRICS, max_age)

    async def sampled_readings(self) -> Readings | None:
        """For the ops sampler: every worker's readings as one gateway's (gathered up to
        ``SAMPLER_MAX_AGE_SECONDS`` ago); None without a hub."""
        gathered = await self._gather(READINGS, SAMPLER_MAX_AGE_SECONDS)
        return None if gathered is None else merge_readings(msgpack.unpackb(gathered))

    async def _gather(self, what: bytes, max_age: float) -> bytes | None:
        max_ms = _ID.pack(min(int(max_age * 1000), 0xFFFF_FFFF))
        return await self._ask(b"G", lambda ask_id: _ID.pack(ask_id) + max_ms + what,
                               GATHER_SECONDS + 1.0)

    async def claim(self, prefix: int, replica_id: str, fallbacks: Sequence[str] = ()) -> str:
        """Where a prefix no replica holds or awaits goes (``Hub.claim``: a sibling's choice
        for it, or past a sibling's unseen new prefix, the first free of ``fallbacks``);
        ``replica_id`` without a hub, with Redis sharing, past ``CLAIM_WAIT_SECONDS``, and
        for ``CLAIM_BACKOFF_SECONDS`` after that."""
        if not self.share_routing or not self.up \
                or self.clock() - self._unanswered_at < CLAIM_BACKOFF_SECONDS:
            return replica_id
        self.claims += 1
        key = prefix & 0xFFFF_FFFF_FFFF_FFFF
        names = _SEP.join(name.encode() for name in (replica_id, *fallbacks))
        answer = await self._ask(b"C", lambda ask_id: _CLAIM.pack(ask_id, key) + names,
                                 CLAIM_WAIT_SECONDS)
        if answer is None:
            self.claims_unanswered += 1
            self._unanswered_at = self.clock()
            return replica_id
        claimed = answer.decode()
        if claimed != replica_id:
            self.claims_followed += 1
        return claimed

    async def _ask(self, kind: bytes, payload: Callable[[int], bytes],
                   timeout: float) -> bytes | None:
        """One question to the hub (``payload`` of its id) and its answer (``A`` or ``K``
        with that id), or None: no hub, or no answer within ``timeout``."""
        if not self.up or self._writer is None:
            return None
        ask_id = next(self._ids) & 0xFFFF_FFFF
        answer = asyncio.get_running_loop().create_future()
        self._answers[ask_id] = answer
        try:
            self._writer.write(frame(kind, payload(ask_id)))
            return await asyncio.wait_for(answer, timeout)
        except (TimeoutError, OSError, RuntimeError):
            return None
        finally:
            self._answers.pop(ask_id, None)

    def _queue(self, entry: Routed | Pending) -> None:
        """Out at the end of this turn of the event loop, not after a flush interval: in
        a burst the siblings decide in the same milliseconds, and a request they hear of
        late is one they place blind. What one turn produced goes in one write (one
        system call, not one an entry), with this worker's in-flight requests when they
        changed: a sibling that bounds each replica's load by a count 20 ms old sees
        the replica this worker just filled as the only busy one, and spills a burst's
        prefix off it. The queue keeps the order when it holds anything, or when the
        hub is not reading."""
        writer = self._writer
        if writer is not None and self._writable(writer):
            self._outbox.append(entry)
            if len(self._outbox) == 1:
                asyncio.get_running_loop().call_soon(self._flush_outbox)
            return
        super()._queue(entry)

    def _writable(self, writer: asyncio.StreamWriter) -> bool:
        """Whether a batch can go now, in order: nothing queued before it, the hub
        reading."""
        return self.up and not self._pending and not writer.is_closing() \
            and writer.transport.get_write_buffer_size() < WRITE_BUFFER_LIMIT

    def _flush_outbox(self) -> None:
        outbox, self._outbox = self._outbox, []
        if not outbox:
            return
        writer = self._writer
        if writer is None or writer.is_closing():
            self.dropped += sum(isinstance(entry, Routed) for entry in outbox)
            return
        self.published += sum(isinstance(entry, Routed) for entry in outbox)
        inflight = self._own_inflight()
        if inflight != self._sent_load:  # the load the siblings bound by, as fresh
            outbox.append(Load(inflight))
            self._sent_load, self._sent_load_at = inflight, self.clock()
        writer.write(frame(b"B", encode_batch(self.instance, outbox)))

    def _on_load_tick(self) -> None:
        """The count goes to the siblings unless a batch carried it meanwhile (under load
        they mostly do: a request that ends has nothing else to send), at once, not
        through the publish loop."""
        self._load_tick = None
        inflight = self._own_inflight()
        if inflight == self._sent_load:
            return
        if self.clock() - self._sent_load_at < self.options.load_tick_seconds:
            self._arm_load_tick()  # a batch carried a count just now: the next tick
            return
        writer = self._writer
        if writer is None or not self._writable(writer):
            self._wake.set()  # the publish loop sends it, behind what is queued
            return
        self._sent_load, self._sent_load_at = inflight, self.clock()
        writer.write(frame(b"B", encode_batch(self.instance, [Load(inflight)])))

    async def _send(self, batch: list[Entry]) -> None:
        if self._writer is None:
            raise ConnectionError("no hub")
        self._flush_outbox()  # what was sent before this batch's in-flight count, first
        self._writer.write(frame(b"B", encode_batch(self.instance, batch)))
        await self._writer.drain()

    async def _read_loop(self, frames: AsyncIterator[tuple[bytes, bytes]]) -> None:
        try:
            async for kind, payload in frames:
                if kind == b"B":
                    try:
                        batch = decode_batch(payload)
                    except BadPayload:
                        self.bad_entries += 1
                        continue
                    if batch.instance != self.instance and self.share_routing:
                        self._apply_batch(batch.instance, batch.entries, live=True)
                elif kind == b"Q" and self._writer is not None:
                    # on the loop, as a scrape reads the state
                    own = self.readings() if payload[_ID.size:] == READINGS \
                        else self.exposition()
                    self._writer.write(frame(b"M", payload[:_ID.size] + own))
                elif kind in (b"A", b"K"):
                    (request_id,) = _ID.unpack(payload[:_ID.size])
                    answer = self._answers.get(request_id)
                    if answer is not None and not answer.done():
                        answer.set_result(payload[_ID.size:])
        except (asyncio.IncompleteReadError, ConnectionError, BadPayload) as exc:
            # The supervisor is gone or going (it stops the workers itself).
            log.warning("worker %d: the hub closed (%s): routing on this worker's own state",
                        self.index, type(exc).__name__)
            self._set_up(False, exc)
