"""A worker's share of the connections (``gateway.server.balance``): real sockets, one loop.

The acceptor is given a table where a sibling's count is set by the test (the
sibling's process is not needed to decide), a real listening socket, and
connections made to it; what it takes is what it counts and serves.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from gateway.server.balance import (
    ABSENT,
    BalancedAcceptor,
    ConnectionTable,
)


class Echo(asyncio.Protocol):
    def __init__(self) -> None:
        self.on_closed = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(b"hi")

    def connection_lost(self, exc: Exception | None) -> None:
        if self.on_closed is not None:
            self.on_closed()


def listener() -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))  # bound only, as a worker inherits it
    return sock


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def answered(reader: asyncio.StreamReader, timeout: float = 1.0) -> bool:
    try:
        return await asyncio.wait_for(reader.readexactly(2), timeout) == b"hi"
    except TimeoutError:
        return False


def test_a_new_table_has_every_worker_absent_and_each_sees_the_others(tmp_path: Path) -> None:
    table = ConnectionTable.create(str(tmp_path / "t"), 3)
    assert [table[i] for i in range(3)] == [ABSENT] * 3
    assert table.least_other(0) is None
    other = ConnectionTable(str(tmp_path / "t"), 3)  # another process's view of the file
    other[1], other[2] = 5, 2
    assert table.least_other(0) == 2
    assert table.least_other(2) == 5
    other[2] = ABSENT
    assert table.least_other(0) == 5


def test_a_worker_leaves_connections_to_a_sibling_holding_fewer(tmp_path: Path) -> None:
    async def main() -> None:
        table = ConnectionTable.create(str(tmp_path / "t"), 2)
        table[1] = 0  # a live sibling with no connection
        sock = listener()
        port = sock.getsockname()[1]
        acceptor = BalancedAcceptor(sock, Echo, table, 0, max_defer=30.0)
        acceptor.start()
        first, kept = await connect(port)  # (a writer dropped closes its connection)
        assert await answered(first)
        assert acceptor.count == 1 and table[0] == 1
        # The sibling holds 0 < 1: the next connection waits for it...
        second, also_kept = await connect(port)
        assert not await answered(second, timeout=0.2)
        assert acceptor.deferred >= 1
        # ... until it takes one (here: its count rises, as if it had).
        table[1] = 1
        assert await answered(second)
        assert acceptor.count == 2 and acceptor.overdue == 0
        acceptor.close()
        kept.close()
        also_kept.close()
        assert table[0] == ABSENT

    asyncio.run(main())


def test_a_connection_the_sibling_does_not_take_is_taken_after_the_longest_wait(
        tmp_path: Path) -> None:
    async def main() -> None:
        table = ConnectionTable.create(str(tmp_path / "t"), 2)
        table[1] = 0  # a sibling that never accepts (its loop stalled)
        sock = listener()
        acceptor = BalancedAcceptor(sock, Echo, table, 0, max_defer=0.05)
        acceptor.start()
        port = sock.getsockname()[1]
        pairs = [await connect(port) for _ in range(3)]
        readers = [reader for reader, _ in pairs]
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert all([await answered(r, timeout=2.0) for r in readers])
        assert acceptor.count == 3 and acceptor.overdue == 2
        assert loop.time() - started < 5.0  # bounded by the longest wait, not a hang
        acceptor.close()

    asyncio.run(main())


async def holding(tmp_path: Path, connections: int) -> tuple[
        ConnectionTable, BalancedAcceptor, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]:
    """Worker 0 with its sibling absent (every connection is its), holding ``connections``
    answered connections."""
    table = ConnectionTable.create(str(tmp_path / "t"), 2)
    sock = listener()
    acceptor = BalancedAcceptor(sock, Echo, table, 0)
    acceptor.start()
    port = sock.getsockname()[1]
    pairs = [await connect(port) for _ in range(connections)]
    assert all([await answered(r) for r, _ in pairs])
    return table, acceptor, pairs


def test_without_a_live_sibling_every_connection_is_taken_and_closing_counts_down(
        tmp_path: Path) -> None:
    async def main() -> None:
        table, acceptor, pairs = await holding(tmp_path, 5)
        assert acceptor.count == 5 and acceptor.deferred == 0
        for _, writer in pairs[:3]:
            writer.close()
        for _ in range(100):
            if table[0] == 2:
                break
            await asyncio.sleep(0.01)
        assert acceptor.count == 2 and table[0] == 2
        acceptor.close()

    asyncio.run(main())


def test_a_worker_over_its_share_gives_back_only_what_it_is_over(tmp_path: Path) -> None:
    async def main() -> None:
        table, acceptor, pairs = await holding(tmp_path, 8)  # the sibling restarting
        assert not acceptor.should_shed()  # no live sibling to give connections to
        table[1] = 0  # the sibling is back, with none
        # 8 against 0: 6 over the margin of 2, and no more, however many requests ask
        assert [acceptor.should_shed() for _ in range(10)] == [True] * 6 + [False] * 4
        assert acceptor.shed == 6
        acceptor.close()
        for _, writer in pairs:
            writer.close()

    asyncio.run(main())
