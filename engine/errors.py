"""Errors raised by the engine layer.

    EngineError                 anything that went wrong talking to a replica
    ├── ReplicaUnavailable      could not connect / connection refused / reset
    │                           before the first byte: safe to retry elsewhere
    ├── ReplicaTimeout          no first byte, or idle between chunks too long
    └── ReplicaStreamBroken     the replica failed after bytes were sent

The HTTP libraries' exceptions are translated where they enter (``engine.remote``
for aiohttp, ``engine.httpx_backend`` for httpx); nothing above this layer
sees their types.
"""

from __future__ import annotations


class EngineError(Exception):
    def __init__(self, replica_id: str, message: str) -> None:
        super().__init__(f"replica {replica_id}: {message}")
        self.replica_id = replica_id
        self.detail = message


class ReplicaUnavailable(EngineError):
    """Nothing was sent back yet: the request may be retried on another replica."""


class ReplicaTimeout(EngineError):
    """The replica did not answer in time."""


class ReplicaStreamBroken(EngineError):
    """The response broke off after the first byte reached the client."""
