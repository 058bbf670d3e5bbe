"""The gateway's listening socket, bound before anything says "serving" or "ready".

uvicorn binds its port only after the app's start-up has run, so a gateway
whose port was taken used to log "serving on ..." and "ready" and only then
die of ``address already in use``. ``prefixgate serve`` binds first
(:func:`bind_listener`, before the embedded replicas start, so a taken port
also costs no replica start-up) and hands the socket to uvicorn; a port it
cannot have is one clear line and exit status 2.
"""

from __future__ import annotations

import errno
import socket


class ListenError(OSError):
    """The address cannot be listened on; the message says which and why."""


def bind_listener(host: str, port: int, backlog: int = 2048) -> socket.socket:
    """A socket bound to ``host:port`` and listening (connections wait in its backlog
    until the server serves them)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ListenError(f"cannot listen on {host}:{port}: {exc.strerror}") from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn's own
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        why = exc.strerror or str(exc)
        if exc.errno == errno.EADDRINUSE:
            why += " (another server listens there; stop it or choose another --port)"
        elif exc.errno == errno.EACCES:
            why += " (ports below 1024 need privileges; choose another --port)"
        raise ListenError(f"cannot listen on {host}:{port}: {why}") from exc
    sock.set_inheritable(False)
    return sock
