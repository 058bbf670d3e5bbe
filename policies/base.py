"""The policy interface and the registry that maps config names to classes.

A policy is constructed once from its typed config and then asked, for each
request, to ``pick`` a replica from an immutable snapshot. ``pick`` must be
pure with respect to the outside world: everything it needs comes in through
its arguments or was injected at construction (clock, random source, index).
Learning from a routed request happens in separate steps that follow the
request (``sent`` to a replica, then ``prefilled`` there or ``abandoned``), so
a decision can be replayed or simulated without side effects.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from policies.events import KVEventConsumer
from policies.options import parse_options
from policies.types import Decision, NoReplicaAvailable, ReplicaView, RouteRequest


class Policy(Protocol):
    name: str
    uses_prefix: bool
    """False for load-only policies: the gateway then skips rendering and hashing."""

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        """Choose a replica. Raises :class:`NoReplicaAvailable` when none is healthy."""
        ...

    def sent(self, request: RouteRequest, replica_id: str) -> None:
        """The request is on its way to ``replica_id``: its prefix is pending there.
        Exactly one of ``prefilled`` and ``abandoned`` follows for that replica."""
        ...

    def prefilled(self, request: RouteRequest, replica_id: str) -> None:
        """``replica_id`` confirmed the request's prefill (its first token, or the whole
        answer): the prompt's blocks are in its cache. Approximate indexes learn here."""
        ...

    def abandoned(self, request: RouteRequest, replica_id: str) -> None:
        """The request failed or was aborted on ``replica_id`` before its first token."""
        ...

    def forget_replica(self, replica_id: str) -> None:
        """Drop all state about a replica (it went unhealthy or was removed)."""
        ...

    def learn_remote(self, replica_id: str, block_hashes: Sequence[int],
                     session_key: str | None, now: float) -> None:
        """Learn what another gateway instance sent to ``replica_id`` (shared routing
        state, ``gateway.fleet.sync``): as ``prefilled``, at ``now`` on this policy's clock."""
        ...

    def learn_remote_pending(self, replica_id: str, block_hashes: Sequence[int],
                             pending: bool) -> None:
        """Another worker of this gateway sent a request holding these blocks to
        ``replica_id`` (``pending``), or it will never be prefilled there (not
        ``pending``; one that is comes as ``learn_remote``): ``sent`` and ``abandoned``
        of a sibling (``gateway.fleet.local``)."""
        ...

    def indexed_blocks(self, replica_id: str) -> int | None:
        """Blocks the policy's prefix index holds for the replica; None without an index."""
        ...

    def event_consumer(self) -> KVEventConsumer | None:
        """Where replicas' KV-cache events go, for a policy that learns from them."""
        ...


def healthy(replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
    """The candidates a policy may choose from; raises when there are none."""
    candidates = [r for r in replicas if r.healthy]
    if not candidates:
        raise NoReplicaAvailable("no healthy replica")
    return candidates


def by_load(replicas: Sequence[ReplicaView]) -> list[ReplicaView]:
    """Replicas ordered least loaded first, ties broken by id for determinism."""
    return sorted(replicas, key=lambda r: (r.load, r.kv_usage, r.id))


@dataclass(frozen=True)
class NoOptions:
    """The options of a policy that takes none (any given is an error)."""


class LoadOnly:
    """What a policy that keeps no prefix state answers: nothing to learn or forget."""

    uses_prefix = False
    name: str

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Any:
        parse_options(NoOptions, options, cls.name)
        return cls()

    def sent(self, request: RouteRequest, replica_id: str) -> None:
        return None

    def prefilled(self, request: RouteRequest, replica_id: str) -> None:
        return None

    def abandoned(self, request: RouteRequest, replica_id: str) -> None:
        return None

    def forget_replica(self, replica_id: str) -> None:
        return None

    def learn_remote(self, replica_id: str, block_hashes: Sequence[int],
                     session_key: str | None, now: float) -> None:
        return None

    def learn_remote_pending(self, replica_id: str, block_hashes: Sequence[int],
                             pending: bool) -> None:
        return None

    def indexed_blocks(self, replica_id: str) -> int | None:
        return None

    def event_consumer(self) -> KVEventConsumer | None:
        return None


PolicyFactory = Callable[[Mapping[str, Any]], Policy]


class Registry:
    """Maps config names to policy factories. Unknown names are errors."""

    def __init__(self) -> None:
        self._factories: dict[str, PolicyFactory] = {}

    def register(self, name: str, factory: PolicyFactory) -> None:
        if name in self._factories:
            raise ValueError(f"policy {name!r} registered twice")
        self._factories[name] = factory

    def names(self) -> list[str]:
        return sorted(self._factories)

    def create(self, name: str, options: Mapping[str, Any] | None = None) -> Policy:
        try:
            factory = self._factories[name]
        except KeyError:
            raise ValueError(
                f"unknown policy {name!r}; choose one of: {', '.join(self.names())}"
            ) from None
        return factory(options or {})
