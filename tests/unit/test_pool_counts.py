"""The engine's counts as the pool reports them to a policy: other clients' requests
as of the last scrape, plus the gateway's own now (replicas faked with
httpx.MockTransport)."""

from __future__ import annotations

import contextlib

import httpx

from engine.backends.base import Timeouts
from engine.backends.httpx_client import HttpxBackend
from engine.pool.replicas import ReplicaPool, ReplicaSpec
from tests.unit.fake_replica import FakeReplica


class FinishingWhileScraped(FakeReplica):
    """A replica whose requests finish while its /metrics answer is on its way back:
    the scrape counts them running, the gateway has already seen them end."""

    def __init__(self, name: str, running: int) -> None:
        super().__init__(name, running=running)
        self.leases: contextlib.ExitStack | None = None

    async def handle(self, request: httpx.Request) -> httpx.Response:
        response = await super().handle(request)
        if request.url.path == "/metrics" and self.leases is not None:
            self.leases.close()      # the gateway's requests there end meanwhile
            self.leases = None
        return response


def pool_of(replica: FakeReplica) -> ReplicaPool:
    backend = HttpxBackend(replica.name, f"http://{replica.name}", Timeouts(),
                           transport=replica.transport())
    return ReplicaPool([(ReplicaSpec(id=replica.name, url=f"http://{replica.name}",
                                     model=replica.model), backend)])


async def test_requests_that_end_during_a_scrape_are_not_taken_for_other_clients() -> None:
    """At the end of a burst the replica still ran 20 of the gateway's requests when it
    answered the scrape, and they ended before the answer was read. They are not another
    client's: the next burst must see the replica idle, not 20 requests busy."""
    replica = FinishingWhileScraped("r0", running=20)
    pool = pool_of(replica)
    stack = contextlib.ExitStack()
    for _ in range(20):
        stack.enter_context(pool.lease("r0", 100))
    replica.leases = stack
    await pool.probe(pool.get("r0"))
    [view] = pool.snapshot()
    assert view.inflight == 0
    assert (view.running, view.waiting) == (0, 0)


async def test_another_clients_requests_still_count() -> None:
    """Requests the gateway never sent (another client's) stay on the replica's load."""
    replica = FakeReplica("r0", running=7)
    pool = pool_of(replica)
    with pool.lease("r0", 100):
        replica.running = 8          # 7 of another client's, 1 of the gateway's
        await pool.probe(pool.get("r0"))
        [view] = pool.snapshot()
        assert view.inflight == 1 and view.running + view.waiting == 8
    [view] = pool.snapshot()
    assert view.running + view.waiting == 7
