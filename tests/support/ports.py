"""A free loopback TCP port for a server a test is about to start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """Ask the OS for an unused port on 127.0.0.1.

    The port is released before returning, so another process could take it
    in between; tests start their server right away, which makes that rare.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
