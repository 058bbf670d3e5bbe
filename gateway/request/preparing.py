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

The count is kept on the serving loop; :meth:`Preparing.wait_idle` may be
called from any thread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class Preparing:
    def __init__(self) -> None:
        self._count = 0
        self._idle = threading.Event()
        self._idle.set()

    @property
    def count(self) -> int:
        return self._count

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """One request being prepared, for the duration of the block (on the loop)."""
        self._count += 1
        self._idle.clear()
        try:
            yield
        finally:
            self._count -= 1
            if self._count == 0:
                self._idle.set()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no request is being prepared (True), or ``timeout`` passed (False)."""
        return self._idle.wait(timeout)
