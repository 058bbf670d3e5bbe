"""Requests the gateway is still preparing: between their arrival and their decision.

That stretch (read the body, parse, render, tokenize, hash, decide) is the
gateway's own time on every request's way to its first token, and in a
burst it is all that stands between a request and its replica. Work that
can wait (the live prompt linter: ``gateway.server.live_lint``) waits for it
to be empty: in one process a worker thread still takes the interpreter
from the serving loop half of the time while both want it, so "off the
loop" alone was not enough: in a burst of 100 requests behind 8 new
1,024-token prefixes the linter's thread doubled the gateway's time before a
request left (docs/benchmarks/bursts.md).

The count is kept on the serving loop, and nothing on the loop wakes another
thread: :meth:`Preparing.wait_idle`, called from the linter's thread, looks at
the count every few milliseconds. A ``threading.Event`` set and cleared by
each request put a condition notification (and a hand-over of the
interpreter to the waiting thread) on every request's path: 7% of the
gateway's samples in a profile of streaming traffic (``python -m loadtest
profile``; docs/benchmarks/overhead.md).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

POLL_SECONDS = 0.005
"""How often a thread waiting for the gateway to be idle looks at the count."""


class Preparing:
    def __init__(self, poll_seconds: float = POLL_SECONDS) -> None:
        self._count = 0
        self.poll_seconds = poll_seconds

    @property
    def count(self) -> int:
        return self._count

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """One request being prepared, for the duration of the block (on the loop)."""
        self._count += 1
        try:
            yield
        finally:
            self._count -= 1

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block the calling thread (never the serving loop's) until no request is being
        prepared (True), or ``timeout`` passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._count:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(self.poll_seconds)
        return True
