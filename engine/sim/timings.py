"""When each request reached the simulator and when its first token left it.

For latency benchmarks that put a hop (a gateway) between a client and the
replica: the client knows when it sent a request and when the first token
arrived; this log knows, for the same ``X-Request-Id``, when the replica's
handler got the request and, for a stream, when its first token was ready
to be sent. ``GET /sim/timings?prefix=...`` returns it. The
difference is the time spent outside the replica (network, proxy, client),
free of the replica's own queueing and engine-step phase, so two paths can
be compared request by request instead of through two noisy TTFT
distributions.

Times are ``time.perf_counter()`` readings: ``CLOCK_MONOTONIC`` on Linux,
one clock for every process on the machine, so a client on the same host
can subtract its own readings. Only requests that carry an
``X-Request-Id`` are logged; the log keeps the most recent ``capacity``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from policies.lru import LRU


@dataclass(slots=True)
class RequestTiming:
    received: float
    first_token: float | None = None

    def token(self) -> None:
        if self.first_token is None:
            self.first_token = time.perf_counter()


class TimingLog:
    def __init__(self, capacity: int = 65536) -> None:
        self.capacity = capacity
        self._log: LRU[str, RequestTiming] = LRU(capacity)

    def received(self, caller_id: str | None) -> RequestTiming | None:
        if not caller_id:
            return None
        timing = RequestTiming(time.perf_counter())
        self._log.put(caller_id, timing)
        return timing

    def dump(self, prefix: str = "") -> list[dict[str, Any]]:
        return [{"id": caller_id, "received": t.received, "first_token": t.first_token}
                for caller_id, t in self._log.items() if caller_id.startswith(prefix)]
