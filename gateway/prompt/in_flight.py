"""Work under way, by key: a second caller for the same key waits for the first one's.

A burst of requests behind one new long prefix (a system prompt, a document)
reaches the gateway at once: every request finds the prefix's text missing
from the piece memo, since the first one to tokenize it has not finished.
Without this each of them tokenized the same text in a worker thread of its
own: a burst of 100 requests behind a new 4,096-token prefix cost the
gateway 100 tokenizations of it (about 80% of its CPU in that burst, and its
requests left seconds late). With it, the first request tokenizes and the
others wait for its result (docs/benchmarks/bursts.md).

The work runs as a task of its own, so the request that started it may go
away (its client left) without leaving the others waiting forever; a failure
is every waiter's failure (routing then falls back to load for them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Hashable, Sequence
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class InFlight(Generic[K, V]):
    def __init__(self) -> None:
        self._running: dict[K, asyncio.Future[V]] = {}

    def __len__(self) -> int:
        return len(self._running)

    def get(self, key: K) -> asyncio.Future[V] | None:
        """The result of ``key``'s work under way, None when none is."""
        return self._running.get(key)

    def start(self, keys: Sequence[K], work: Awaitable[list[V]]) -> asyncio.Future[list[V]]:
        """Run ``work`` (one result per key, in order) as a task; until it ends, ``get``
        finds each key's share of it. Keys already under way must not be passed."""
        task: asyncio.Future[list[V]] = asyncio.ensure_future(work)
        loop = asyncio.get_running_loop()
        shares = [loop.create_future() for _ in keys]
        for key, share in zip(keys, shares):
            self._running[key] = share

        def settle(done: asyncio.Future[list[V]]) -> None:
            for key, share in zip(keys, shares):
                if self._running.get(key) is share:
                    del self._running[key]
            if done.cancelled():
                for share in shares:
                    share.cancel()
                return
            error = done.exception()
            for index, share in enumerate(shares):
                if error is None:
                    share.set_result(done.result()[index])
                else:
                    share.set_exception(error)
                    share.exception()  # retrieved: no warning when nobody waited for it

        task.add_done_callback(settle)
        return task
