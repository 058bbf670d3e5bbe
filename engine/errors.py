"""Errors raised by the engine layer.

    EngineError                 anything that went wrong talking to a replica
    ├── ReplicaUnavailable      no answer came: the connection was reset or closed
    │   │                       before the first byte, or the replica left rotation
    │   │                       while the request waited
    │   └── ReplicaUnreachable  it could not even be reached (refused, no route,
    │                           connect timeout): the request never arrived there
    ├── ReplicaTimeout          no first byte, or idle between chunks too long
    └── ReplicaStreamBroken     the replica failed after bytes were sent

Which failures the proxy retries on another replica is its decision
(``gateway.request.proxy``): an unreachable replica never saw the request, but one
that failed while holding it may have failed *because* of it.

Failures are translated where they enter (``engine.backends.h1`` and
``engine.backends.remote`` for the remote connection, ``engine.backends.httpx_client``
for httpx); nothing above this layer sees a library's types.
"""

from __future__ import annotations


class EngineError(Exception):
    def __init__(self, replica_id: str, message: str) -> None:
        super().__init__(f"replica {replica_id}: {message}")
        self.replica_id = replica_id
        self.detail = message


class ReplicaUnavailable(EngineError):
    """Nothing was sent back yet."""


class ReplicaUnreachable(ReplicaUnavailable):
    """The replica could not be reached: the request never arrived there."""


class ReplicaTimeout(EngineError):
    """The replica did not answer in time."""


class ReplicaStreamBroken(EngineError):
    """The response broke off after the first byte reached the client."""
