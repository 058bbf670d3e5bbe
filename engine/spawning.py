"""A SIGTERM that exits the process waits out a child's spawn, so the child is stopped too.

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
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

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
