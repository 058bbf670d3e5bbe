"""One workload spread over several gateway instances, as a load balancer would.

``SplitClient`` hands each request to the next of its clients in turn (no
stickiness: the turns of one conversation land on different instances, the
hard case for instances that do not share what they learned). A contender
whose launch returns several comma-separated URLs (``prefixgate-2:...``,
``prefixgate-2-redis:...`` in :mod:`.contenders`) is driven through one.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence

from loadtest.client import ChatCall, ChatOutcome, Clock, StreamClient


class SplitClient:
    def __init__(self, clients: Sequence[StreamClient]) -> None:
        if not clients:
            raise ValueError("a split client needs at least one client")
        self.clients = list(clients)
        self._next = itertools.cycle(self.clients)

    async def stream_chat(self, model: str, call: ChatCall, clock: Clock,
                          run_start: float) -> ChatOutcome:
        return await next(self._next).stream_chat(model, call, clock, run_start)

    async def close(self) -> None:
        await asyncio.gather(*(client.close() for client in self.clients))
