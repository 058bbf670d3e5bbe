"""What may cut short a request that is waiting on a replica, before its answer starts.

While the proxy waits for a replica (the status line, a stream's first chunk,
or a whole non-streaming body) three things can make waiting pointless:

    ClientGone              the client disconnected: abandon the attempt, which
                            closes the upstream connection (vLLM aborts the request)
    ReplicaUnavailable      the replica's breaker opened because it failed (it stopped
                            answering probes): try the next replica
    ShuttingDown            the gateway's drain period is over: answer 503

A :class:`RequestGuard` watches the client from the moment the request is sent
and turns these into exceptions raised where the handler's task is waiting —
by cancelling that task and un-cancelling it (as ``asyncio.timeout`` does), so
the request keeps running in the handler's own task and nothing is copied into
a second one. An interrupt only lands while the guard is armed
(``waiting_on``); the interrupts come from other tasks and callbacks, which run
only while the handler's task is suspended inside the armed block.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from starlette.types import Receive

from gateway.errors import GatewayError
from gateway.request.drain import DRAIN_MESSAGE
from gateway.request.streaming import wait_disconnect


class ClientGone(Exception):
    """The client disconnected before its answer started."""


class ShuttingDown(GatewayError):
    status = 503
    type = "ServiceUnavailableError"
    code = "gateway_draining"


class RequestGuard:
    def __init__(self, receive: Receive) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self.replica_id: str | None = None
        """The replica the request is waiting on, while armed."""
        self._armed = False
        self._pending: BaseException | None = None
        self._final: BaseException | None = None
        self._watcher: asyncio.Future[None] | None = asyncio.ensure_future(
            self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        await wait_disconnect(receive)
        self.interrupt(ClientGone(), final=True)

    def interrupt(self, reason: BaseException, final: bool = False) -> None:
        """Raise ``reason`` where the request waits; ``final``: also at the next wait."""
        if final and self._final is None:
            self._final = reason
        if self._armed and self._pending is None:
            self._pending = reason
            self._task.cancel()

    @contextlib.contextmanager
    def waiting_on(self, replica_id: str) -> Iterator[None]:
        if self._final is not None:
            raise self._final
        self.replica_id, self._armed = replica_id, True
        try:
            yield
        except asyncio.CancelledError:
            reason, self._pending = self._pending, None
            if reason is not None and self._task.uncancel() == 0:
                raise reason from None
            raise  # someone else cancelled the request too
        finally:
            self.replica_id, self._armed = None, False

    def cut(self) -> None:
        """The drain period is over: the request, still waiting, gets a 503."""
        self.interrupt(ShuttingDown(DRAIN_MESSAGE, headers={"retry-after": "1"}), final=True)

    def hand_over(self) -> asyncio.Future[None]:
        """The watch on the client, for the stream relay to go on with (one task
        per stream, not two); done when the client has left."""
        watcher, self._watcher = self._watcher, None
        assert watcher is not None
        return watcher

    def close(self) -> None:
        """Stop watching the client, unless the watch was handed over."""
        if self._watcher is not None:
            self._watcher.cancel()
