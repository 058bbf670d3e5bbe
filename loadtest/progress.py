"""A one-line progress display on stderr for a running load.

On a terminal the line is redrawn in place (carriage return) twice a second;
when stderr is a file or a pipe (CI logs) a full line is written every
``log_every`` seconds instead, so logs stay readable. Counters are plain
attributes the driver bumps; :meth:`run` is a cancellable task.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import TextIO


class Progress:
    def __init__(
        self,
        label: str,
        total: int,
        clock: Callable[[], float],
        stream: TextIO | None = None,
        log_every: float = 10.0,
    ) -> None:
        self.label = label
        self.total = total
        self.done = 0
        self.errors = 0
        self.inflight = 0
        self._clock = clock
        self._start = clock()
        self._stream = stream if stream is not None else sys.stderr
        self._tty = bool(getattr(self._stream, "isatty", lambda: False)())
        self._log_every = log_every

    def line(self) -> str:
        elapsed = self._clock() - self._start
        width = 24
        filled = int(width * self.done / self.total) if self.total else width
        bar = "#" * filled + "." * (width - filled)
        rate = self.done / elapsed if elapsed > 0 else 0.0
        return (f"{self.label} [{bar}] {self.done}/{self.total} done, {self.inflight} in flight, "
                f"{self.errors} errors, {rate:.1f} req/s, {elapsed:.0f}s")

    def _write(self, final: bool = False) -> None:
        if self._tty:
            self._stream.write("\r\x1b[2K" + self.line() + ("\n" if final else ""))
        else:
            self._stream.write(self.line() + "\n")
        self._stream.flush()

    async def run(self) -> None:
        period = 0.5 if self._tty else self._log_every
        try:
            while True:
                await asyncio.sleep(period)
                self._write()
        except asyncio.CancelledError:
            self._write(final=True)
            raise
