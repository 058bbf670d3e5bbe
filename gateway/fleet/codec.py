"""The wire format of shared routing state: what gateway instances write to Redis.

Two things travel (``gateway.fleet.sync`` does the I/O):

* **Batches**, one stream entry each (field ``b``): msgpack
  ``[VERSION, instance_id, [entry, ...]]``, every entry a list tagged by
  its first element:

  - ``[ROUTED, replica_id, hashes, session_key | None]``: the instance sent a
    prompt with these KV blocks to the replica (what ``Policy.observe``
    learns), ``hashes`` packed as little-endian unsigned 64-bit integers;
  - ``[LOAD, {replica_id: in_flight}]``: the instance's own in-flight
    requests per replica, sent when they change and as a heartbeat;
  - ``[PENDING, replica_id, hashes, on_its_way, tokens]``: between one
    gateway's workers only (``gateway.fleet.local``), a request holding these
    blocks, with ``tokens`` to prefill there, was sent to the replica (true) or
    will never be prefilled there (false); one that is comes as ``ROUTED``.

* **The snapshot** (one key): msgpack ``{"v", "id", "at", "replicas",
  "sessions"}``: the stream id it covers, its unix write time, per replica
  the held blocks oldest first in runs ``[age_seconds, hashes]`` (one run per
  recorded prompt), and ``[session_key, replica_id, age_seconds]`` per session.

Anything that does not decode (another version, a foreign writer) raises
:class:`BadPayload`; the reader counts and skips it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgpack

VERSION = 1
ROUTED = 0
LOAD = 1
PENDING = 2


class BadPayload(ValueError):
    """A stream entry or snapshot this version cannot read."""


@dataclass(frozen=True, slots=True)
class Routed:
    replica_id: str
    block_hashes: tuple[int, ...]
    session_key: str | None = None


@dataclass(frozen=True, slots=True)
class Load:
    inflight: dict[str, int]


@dataclass(frozen=True, slots=True)
class Pending:
    replica_id: str
    block_hashes: tuple[int, ...]
    on_its_way: bool
    tokens: int = 0
    """Prompt tokens it must prefill there (its uncached part, as predicted)."""


Entry = Routed | Load | Pending


@dataclass(frozen=True, slots=True)
class Batch:
    instance: str
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class Run:
    """Blocks one prompt touched, ``age`` seconds before the snapshot was written."""

    age: float
    block_hashes: tuple[int, ...]


@dataclass(frozen=True)
class Snapshot:
    stream_id: str
    written_at: float
    """Unix time of the write."""
    replicas: dict[str, list[Run]] = field(default_factory=dict)
    """Per replica, oldest run first."""
    sessions: list[tuple[str, str, float]] = field(default_factory=list)
    """``(session_key, replica_id, age)``."""


def pack_hashes(hashes: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(hashes)}Q", *(h & 0xFFFF_FFFF_FFFF_FFFF for h in hashes))


def unpack_hashes(data: bytes) -> tuple[int, ...]:
    if not isinstance(data, bytes) or len(data) % 8:
        raise BadPayload("block hashes must be a multiple of 8 bytes")
    return struct.unpack(f"<{len(data) // 8}Q", data)


def encode_batch(instance: str, entries: Sequence[Entry]) -> bytes:
    wire: list[list[object]] = []
    for entry in entries:
        if isinstance(entry, Routed):
            wire.append([ROUTED, entry.replica_id, pack_hashes(entry.block_hashes),
                         entry.session_key])
        elif isinstance(entry, Pending):
            wire.append([PENDING, entry.replica_id, pack_hashes(entry.block_hashes),
                         entry.on_its_way, entry.tokens])
        else:
            wire.append([LOAD, entry.inflight])
    return msgpack.packb([VERSION, instance, wire], use_bin_type=True)


def _entry(item: object) -> Entry:
    if not isinstance(item, list) or not item:
        raise BadPayload("an entry must be a tagged list")
    if item[0] == ROUTED and len(item) == 4 and isinstance(item[1], str) \
            and (item[3] is None or isinstance(item[3], str)):
        return Routed(item[1], unpack_hashes(item[2]), item[3])
    if item[0] == LOAD and len(item) == 2 and isinstance(item[1], dict) \
            and all(isinstance(k, str) and isinstance(v, int) for k, v in item[1].items()):
        return Load(dict(item[1]))
    if item[0] == PENDING and len(item) == 5 and isinstance(item[1], str) \
            and isinstance(item[3], bool) and isinstance(item[4], int):
        return Pending(item[1], unpack_hashes(item[2]), item[3], item[4])
    raise BadPayload(f"unknown entry {item[0]!r}")


def decode_batch(data: bytes) -> Batch:
    try:
        version, instance, entries = msgpack.unpackb(data, raw=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise BadPayload(f"not a batch: {exc}") from None
    if version != VERSION or not isinstance(instance, str) or not isinstance(entries, list):
        raise BadPayload(f"batch version {version!r} is not {VERSION}")
    return Batch(instance, tuple(_entry(item) for item in entries))


def encode_snapshot(snapshot: Snapshot) -> bytes:
    return msgpack.packb({
        "v": VERSION, "id": snapshot.stream_id, "at": snapshot.written_at,
        "replicas": {replica: [[run.age, pack_hashes(run.block_hashes)] for run in runs]
                     for replica, runs in snapshot.replicas.items()},
        "sessions": [list(item) for item in snapshot.sessions],
    }, use_bin_type=True)


def decode_snapshot(data: bytes) -> Snapshot:
    try:
        raw = msgpack.unpackb(data, raw=False)
        if not isinstance(raw, dict) or raw.get("v") != VERSION:
            raise BadPayload("snapshot version is not 1")
        replicas = {str(replica): [Run(float(age), unpack_hashes(hashes))
                                   for age, hashes in runs]
                    for replica, runs in raw["replicas"].items()}
        sessions = [(str(key), str(replica), float(age))
                    for key, replica, age in raw["sessions"]]
        return Snapshot(str(raw["id"]), float(raw["at"]), replicas, sessions)
    except (KeyError, ValueError, TypeError, AttributeError, msgpack.UnpackException) as exc:
        if isinstance(exc, BadPayload):
            raise
        raise BadPayload(f"not a snapshot: {exc}") from None
