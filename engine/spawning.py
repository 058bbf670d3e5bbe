"""Children in sessions of their own: started so that a SIGTERM stops them too, and stopped.

``prefixgate serve`` and ``prefixgate kv-quality`` start servers as children,
each in a session of its own, and stop them on the way out; a SIGTERM while
they start (``docker stop``, a supervisor) exits through that clean-up
(:func:`exit_on_signal` raises ``SystemExit``). A SIGTERM that landed inside
``subprocess.Popen`` after its fork, or before the caller had recorded the
child, unwound past a child nobody held: it ran on, holding its ports and
memory (and the pipe a supervisor reads to its end).

Around a spawn and its recording, ``with held_exit():`` defers that exit to
the block's end, where whatever clean-up surrounds the block covers the child::

    signal.signal(signal.SIGTERM, exit_on_signal)
    ...
    with held_exit():
        procs.append(subprocess.Popen(args, start_new_session=True))

:func:`stop_groups` stops such children: each one's process group at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence

_state = threading.local()  # signal handlers run in the main thread: its holds count


def _holds() -> int:
    return int(getattr(_state, "holds", 0))


def exit_on_signal(signum: int, frame: object) -> None:
    """The SIGTERM handler: ``SystemExit(128 + signum)`` now, or at the end of a held block."""
    if _holds():
        _state.pending = signum
        return
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def held_exit() -> Iterator[None]:
    """Defer :func:`exit_on_signal`'s exit until the outermost held block ends."""
    _state.holds = _holds() + 1
    try:
        yield
    finally:
        _state.holds -= 1
        pending = getattr(_state, "pending", None)
        if not _state.holds and pending is not None:
            _state.pending = None
            raise SystemExit(128 + pending)


def stop_groups(procs: Sequence[subprocess.Popen[bytes]], grace: float = 10.0) -> None:
    """SIGTERM the process group of each child (``start_new_session``) at once, SIGKILL
    what is left after ``grace`` seconds: one after another, children still starting up
    (which finish that before they stop) took ``grace`` each."""
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
