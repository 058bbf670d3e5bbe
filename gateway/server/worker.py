"""One worker process of ``prefixgate serve --workers N`` (``gateway.server.workers``).

Started by the supervisor as ``python -m gateway.server.worker INDEX HUB FDS TABLE``:
the settings come pickled on standard input (secrets never touch the disk),
the listening sockets as inherited file descriptors, ``TABLE`` the workers'
connection counts (``gateway.server.balance``). It serves them like a
one-process gateway, sharing routing state with its siblings through the
supervisor's hub at ``HUB``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import pickle
import signal
import socket
import sys
from collections.abc import Sequence

from gateway.config import Settings
from gateway.fleet.local import WorkerRole
from gateway.server.app import create_app
from gateway.server.balance import Balance, ConnectionTable
from gateway.server.http import serve_app

_PR_SET_PDEATHSIG = 1


def _die_with_supervisor() -> None:
    """SIGTERM (a drain) when the supervisor dies, even by SIGKILL (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def main(argv: Sequence[str]) -> int:
    index, hub, fds = int(argv[0]), argv[1], [int(fd) for fd in argv[2].split(",")]
    table_path, workers = argv[3].rsplit(":", 1)
    _die_with_supervisor()
    settings = pickle.loads(sys.stdin.buffer.read())
    if not isinstance(settings, Settings):
        print("prefixgate worker: no settings on standard input", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format=f"%(asctime)s %(levelname)s %(name)s[w{index}]: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if not settings.access_log:
        logging.getLogger("prefixgate.access").setLevel(logging.WARNING)
    sockets = [socket.socket(fileno=fd) for fd in fds]
    role = WorkerRole(index, hub)
    app = create_app(settings, worker=role)
    table = ConnectionTable(table_path, int(workers))
    serve_app(app, settings, sockets, announce=index == 0,
              balance=Balance(table, index, role.connections))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
