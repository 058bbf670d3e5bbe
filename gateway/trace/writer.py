"""The trace file: bounded, rotated, written by one thread off the event loop.

``TraceWriter.offer(record)`` is all the request path pays: a ``put_nowait``
on a bounded queue. When the queue is full the record is dropped and counted
(``dropped["queue_full"]``): the trace is a sample of the traffic, never a
brake on it. One daemon thread takes records, keys their hash ids
(``gateway.trace.format.TraceKey``: the BLAKE2b work happens there, not on the
loop), decides the sample, encodes and appends them to ``path``.

Rotation: when the next line would take ``path`` past ``max_bytes`` it is
renamed ``path.1`` (``path.1`` to ``path.2``, ..., the oldest, ``path.KEEP``,
deleted) and a new ``path`` begins, so the trace never holds more than
``(keep + 1) * max_bytes`` bytes. Files are created owner-only (0600).

Sample: a request is kept when its first block's keyed id falls in the first
``sample`` of the id space, so a prefix family (every request that starts
with the same block) is kept or left out whole and its reuse survives the
sampling; a prompt shorter than a block is kept with probability ``sample``.
A replay of a sampled trace sees that share of the load: replay it faster
(``prefixgate replay --speed``) to ask about the whole.

``snapshot()`` opens the files oldest first at their current lengths, after
what was written so far is flushed (whole lines only), for a download that
runs while writing goes on: a rotation meanwhile renames, but does not change,
the files it holds open.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import random
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gateway.trace.format import ID_BITS, TraceKey, TraceLine

log = logging.getLogger("prefixgate.trace")

_STOP = object()


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """What the request path hands over: the gateway's own hashes, not yet keyed."""

    timestamp_ms: int
    input_length: int
    output_length: int
    block_hashes: tuple[int, ...]
    block_size: int
    cache_salt: str | None
    model: str
    replica: str
    policy: str
    stream: bool
    ttft_ms: float | None
    cached_tokens: int | None
    session_key: str | None


@dataclass(frozen=True, slots=True)
class TraceLimits:
    max_bytes: int = 64 << 20
    keep: int = 3
    queue: int = 10_000
    sample: float = 1.0


class RotatingFile:
    """``path`` and its rotated predecessors ``path.1`` .. ``path.keep``."""

    def __init__(self, path: Path, max_bytes: int, keep: int) -> None:
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.rotations = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = self._open()
        self.size = self._file.tell()

    def _open(self) -> BinaryIO:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        handle = os.fdopen(fd, "ab")
        handle.seek(0, os.SEEK_END)
        return handle

    def rotated(self, index: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{index}")

    def files(self) -> list[Path]:
        """Oldest first, the current one last."""
        older = [self.rotated(i) for i in range(self.keep, 0, -1)]
        return [p for p in older if p.exists()] + [self.path]

    def write(self, data: bytes) -> None:
        if self.size and self.size + len(data) > self.max_bytes:
            self.rotate()
        self._file.write(data)
        self.size += len(data)

    def rotate(self) -> None:
        self._file.close()
        if self.keep == 0:
            self.path.unlink(missing_ok=True)
        else:
            self.rotated(self.keep).unlink(missing_ok=True)
            for index in range(self.keep - 1, 0, -1):
                if self.rotated(index).exists():
                    os.replace(self.rotated(index), self.rotated(index + 1))
            os.replace(self.path, self.rotated(1))
        self._file = self._open()
        self.size = 0
        self.rotations += 1

    def flush(self) -> None:
        self._file.flush()

    def disk_bytes(self) -> int:
        total = 0
        for path in self.files():
            with contextlib.suppress(OSError):
                total += path.stat().st_size
        return total

    def close(self) -> None:
        self._file.close()


def load_secret(configured: str | None, path: Path) -> bytes:
    """The configured secret, or the one kept beside the trace (made on first use)."""
    if configured:
        return configured.encode("utf-8")
    key_file = path.with_name(path.name + ".key")
    try:
        return bytes.fromhex(key_file.read_text().strip())
    except FileNotFoundError:
        pass
    secret = os.urandom(32)
    key_file.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secret.hex() + "\n")
    return secret


class TraceWriter:
    def __init__(self, path: Path, key: TraceKey, limits: TraceLimits,
                 rng: random.Random | None = None) -> None:
        self.limits = limits
        self._key = key
        self._rng = rng or random.Random()
        self._file = RotatingFile(path, limits.max_bytes, limits.keep)
        self._queue: queue.Queue[object] = queue.Queue(maxsize=limits.queue)
        self._lock = threading.Lock()
        self.lines = 0
        self.sampled_out = 0
        self.dropped: Counter[str] = Counter()
        self._thread: threading.Thread | None = None
        self._threshold = int(limits.sample * (1 << ID_BITS))

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def rotations(self) -> int:
        return self._file.rotations

    def disk_bytes(self) -> int:
        return self._file.disk_bytes()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="prefixgate-trace", daemon=True)
        self._thread.start()

    def offer(self, record: TraceRecord) -> None:
        """Queue a record for writing; never blocks (full: dropped and counted)."""
        try:
            self._queue.put_nowait(record)
        except queue.Full:
            self.dropped["queue_full"] += 1

    def stop(self, timeout: float = 5.0) -> None:
        """Write what is queued, then stop the thread and close the file."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join(timeout)
            self._thread = None
        with self._lock:
            self._file.close()

    def drain(self) -> None:
        """Write everything queued now, on the caller's thread (tests; no thread started)."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item is not _STOP:
                self._write(item)  # type: ignore[arg-type]
        with self._lock:
            self._file.flush()

    @contextlib.contextmanager
    def snapshot(self) -> Iterator[list[tuple[BinaryIO, int]]]:
        """The files, oldest first, open, each with the length to read (module docstring)."""
        opened: list[tuple[BinaryIO, int]] = []
        try:
            with self._lock:
                self._file.flush()
                for path in self._file.files():
                    with contextlib.suppress(FileNotFoundError):
                        handle: BinaryIO = path.open("rb")
                        opened.append((handle, os.fstat(handle.fileno()).st_size))
            yield opened
        finally:
            for handle, _ in opened:
                handle.close()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            self._write(item)  # type: ignore[arg-type]
            if self._queue.empty():
                with self._lock:
                    self._flush_quietly()

    def _flush_quietly(self) -> None:
        try:
            self._file.flush()
        except OSError as exc:
            self.dropped["write_error"] += 1
            log.warning("trace: cannot write %s: %s", self._file.path, exc)

    def _keep(self, first_id: int | None) -> bool:
        if self.limits.sample >= 1.0:
            return True
        if first_id is None:
            return self._rng.random() < self.limits.sample
        return first_id < self._threshold

    def _write(self, record: TraceRecord) -> None:
        salt = record.cache_salt
        first = self._key.block_ids(record.block_hashes[:1], salt)
        if not self._keep(first[0] if first else None):
            self.sampled_out += 1
            return
        line = TraceLine(
            timestamp_ms=record.timestamp_ms, input_length=record.input_length,
            output_length=record.output_length,
            hash_ids=tuple(self._key.block_ids(record.block_hashes, salt)),
            block_size=record.block_size, model=record.model, replica=record.replica,
            policy=record.policy, stream=record.stream, ttft_ms=record.ttft_ms, cached_tokens=record.cached_tokens,
            session=self._key.session_id(record.session_key) if record.session_key else None)
        data = line.encode()
        with self._lock:
            try:
                self._file.write(data)
            except OSError as exc:
                self.dropped["write_error"] += 1
                log.warning("trace: cannot write %s: %s", self._file.path, exc)
                return
        self.lines += 1

