"""Connections spread over the workers of ``prefixgate serve --workers N``.

The workers share one listening socket, and the kernel hands a waiting
connection to whichever worker calls ``accept`` first. An event loop accepts
every connection waiting when it wakes, so a burst of new connections (a
client's connection pool opening, a load balancer reconnecting) mostly lands
on one worker, and an HTTP/1.1 client keeps its connections: that worker
then serves most of the traffic while its siblings idle. Measured with each
worker on a share of a core (``python -m loadtest overhead --core-quota``):
two workers served 0.94x one worker's requests a second when one of them had
taken the pool.

So a worker accepts on its own terms (:class:`BalancedAcceptor`): it takes a
connection only while it holds no more connections than the least-loaded
live sibling, and otherwise leaves it in the backlog for that sibling. The
counts are a table in shared memory (:class:`ConnectionTable`, one slot per
worker, -1 while a worker is not accepting), so a worker reads its siblings'
counts without a message. A sibling that does not take the connection (its
loop busy, stalled, or the process gone before the supervisor cleared its
slot) gets ``MAX_DEFER_SECONDS``: after that the worker takes it anyway, so
balancing never keeps a client waiting longer than that.

Connections already held can be out of balance too: a worker that died and
was started again comes back to none, its sibling holding every connection
its clients opened meanwhile, and keeps them as long as the clients do. A
worker holding more than ``SHED_MARGIN`` connections over the least-loaded
sibling answers the next request on one of them with ``Connection: close``
(the answer is whole; the client opens a new connection for its next
request, which the balance above hands to the sibling), one connection per
connection it is over, never more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import mmap
import os
import select
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass

from gateway.fleet.local import Connections

log = logging.getLogger("prefixgate.server")

ABSENT = -1
"""A slot's value while its worker does not accept (starting, draining, gone)."""

RETRY_SECONDS = 0.002
"""How soon a worker that left a connection to a sibling looks at the backlog again."""

MAX_DEFER_SECONDS = 0.02
"""The longest a worker leaves a waiting connection to a less-loaded sibling."""

ACCEPT_BATCH = 64
"""At most this many connections accepted in one turn of the loop."""

SHED_MARGIN = 2
"""Connections over the least-loaded live sibling's count (or an eighth of it, if more)
that a worker holds before it answers with ``Connection: close`` to give some back."""


class ConnectionTable:
    """One signed 64-bit count per worker in a shared file mapping.

    Each worker writes its own slot only (an aligned 8-byte store), and reads
    the others'; the supervisor creates the file and marks a slot absent when
    its worker exits."""

    def __init__(self, path: str, workers: int) -> None:
        fd = os.open(path, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, workers * 8)
        finally:
            os.close(fd)
        self._slots = memoryview(self._map).cast("q")

    @classmethod
    def create(cls, path: str, workers: int) -> ConnectionTable:
        """A new table at ``path``, every slot absent."""
        with open(path, "wb") as handle:
            handle.write(ABSENT.to_bytes(8, "little", signed=True) * workers)
        return cls(path, workers)

    def __getitem__(self, index: int) -> int:
        return int(self._slots[index])

    def __setitem__(self, index: int, value: int) -> None:
        self._slots[index] = value

    def least_other(self, index: int) -> int | None:
        """The smallest count among the live siblings of ``index``; None when none is."""
        others = [v for i, v in enumerate(self._slots) if i != index and v != ABSENT]
        return min(others) if others else None


@dataclass(frozen=True)
class Balance:
    """What a worker's server needs to balance its client port: the table, its slot, and
    where to leave its acceptor for the metrics."""

    table: ConnectionTable
    index: int
    connections: Connections


class BalancedAcceptor:
    """Accepts from ``sock`` (shared with sibling workers) while this worker holds no
    more connections than the least-loaded live sibling (see the module)."""

    def __init__(self, sock: socket.socket, protocol_factory: Callable[[], asyncio.Protocol],
                 table: ConnectionTable, index: int, backlog: int = 2048,
                 max_defer: float = MAX_DEFER_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.sock = sock
        self.factory = protocol_factory
        self.table = table
        self.index = index
        self.clock = clock
        self.backlog = backlog
        self.max_defer = max_defer
        self.count = 0
        self.deferred = 0
        """Times this worker left a waiting connection to a sibling."""
        self.overdue = 0
        """Connections taken because the sibling they were left to did not take them."""
        self.shed = 0
        """Connections answered with ``Connection: close`` to give them to a sibling."""
        self.shedding = 0
        """Of those, the ones not closed yet."""
        self._waiting_since: float | None = None
        self._warned_at = -1e9
        self._retry: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = asyncio.Event()

    # -- the asyncio.Server face uvicorn's shutdown uses --------------------------------

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self.sock.listen(self.backlog)  # as asyncio's server does (a worker's is bound only)
        self.sock.setblocking(False)
        self.table[self.index] = self.count
        self._loop.add_reader(self.sock.fileno(), self._readable)

    def close(self) -> None:
        """Stop accepting (what is waiting goes to the siblings); connections stay."""
        if self._loop is None or self._closed.is_set():
            return
        self.table[self.index] = ABSENT
        self._cancel_retry()
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self.sock.fileno())
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    # -- accepting ----------------------------------------------------------------------

    def _my_turn(self) -> bool:
        least = self.table.least_other(self.index)
        return least is None or self.count <= least

    def _readable(self) -> None:
        for _ in range(ACCEPT_BATCH):
            if not self._my_turn():
                now = self.clock()
                if self._waiting_since is None:
                    self._waiting_since = now
                if now - self._waiting_since < self.max_defer:
                    self._defer()
                    return
                self.overdue += 1
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                self._waiting_since = None  # nothing waits: a sibling took it
                return
            except OSError as exc:  # out of descriptors, ...: try again shortly
                if self.clock() - self._warned_at > 10:
                    self._warned_at = self.clock()
                    log.warning("accepting a connection failed: %s", exc)
                self._defer()
                return
            self._waiting_since = None
            self._take(conn)

    def _defer(self) -> None:
        """Leave the backlog to the siblings for ``RETRY_SECONDS``."""
        assert self._loop is not None
        self.deferred += 1
        with contextlib.suppress(ValueError, OSError):
            self._loop.remove_reader(self.sock.fileno())
        self._retry = self._loop.call_later(RETRY_SECONDS, self._resume)

    def _resume(self) -> None:
        self._retry = None
        if self._loop is None or self._closed.is_set():
            return
        with contextlib.suppress(OSError, ValueError):
            if not select.select([self.sock], [], [], 0)[0]:
                self._waiting_since = None  # a sibling took what was waiting
        self._loop.add_reader(self.sock.fileno(), self._readable)

    def _cancel_retry(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None

    def should_shed(self) -> bool:
        """Whether the request starting now on one of this worker's connections should
        close it when answered (this worker holds too many); counted when it says yes."""
        least = self.table.least_other(self.index)
        if least is None or self.count - self.shedding <= least + max(SHED_MARGIN, least // 8):
            return False
        self.shedding += 1
        self.shed += 1
        return True

    def _take(self, conn: socket.socket) -> None:
        assert self._loop is not None
        conn.setblocking(False)
        self._count(1)
        self._loop.create_task(self._serve(conn))

    async def _serve(self, conn: socket.socket) -> None:
        assert self._loop is not None
        protocol = self.factory()
        protocol.on_closed = lambda: self._gone(protocol)  # type: ignore[attr-defined]
        protocol.rebalance = self.should_shed  # type: ignore[attr-defined]
        try:
            await self._loop.connect_accepted_socket(lambda: protocol, conn)
        except Exception:  # the connection is gone: the count follows
            log.debug("a connection closed before it was served", exc_info=True)
            protocol.on_closed = None  # type: ignore[attr-defined]
            self._count(-1)
            conn.close()

    def _gone(self, protocol: asyncio.Protocol) -> None:
        if getattr(protocol, "shed_marked", False):
            self.shedding -= 1
        self._count(-1)

    def _count(self, change: int) -> None:
        self.count += change
        if not self._closed.is_set():
            self.table[self.index] = self.count
