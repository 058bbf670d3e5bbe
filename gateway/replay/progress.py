"""A one-line progress bar on stderr while replays run (only on a terminal, unless asked).

    replaying N=4, 8  [##########----------]  51%  4,073/7,986 requests  0:12
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

WIDTH = 24


class ProgressBar:
    def __init__(self, stream: TextIO = sys.stderr, enabled: bool | None = None,
                 clock: Callable[[], float] = time.monotonic, every_s: float = 0.1) -> None:
        self.stream = stream
        self.enabled = stream.isatty() if enabled is None else enabled
        self._clock = clock
        self._started = clock()
        self._last = -1.0
        self._every = every_s
        self._shown = False

    def __call__(self, running: dict[int, tuple[int, int]]) -> None:
        if not self.enabled:
            return
        now = self._clock()
        done = sum(d for d, _ in running.values())
        total = sum(t for _, t in running.values()) or 1
        if now - self._last < self._every and done < total:
            return
        self._last = now
        filled = int(WIDTH * done / total)
        elapsed = int(now - self._started)
        counts = ", ".join(str(n) for n in sorted(running))
        self.stream.write(f"\rreplaying N={counts}  [{'#' * filled}{'-' * (WIDTH - filled)}]"
                          f"  {100 * done // total:3d}%  {done:,}/{total:,} requests"
                          f"  {elapsed // 60}:{elapsed % 60:02d}\033[K")
        self.stream.flush()
        self._shown = True

    def close(self) -> None:
        if self._shown:
            self.stream.write("\r\033[K")
            self.stream.flush()
            self._shown = False
