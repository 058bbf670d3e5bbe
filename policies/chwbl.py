"""chwbl: consistent hashing with bounded loads on the prompt's prefix.

Algorithm (Mirrokni, Thorup, Zadimoghaddam 2018; KubeAI's ``PrefixHash``
strategy): every healthy replica is placed on a 64-bit hash ring at
``virtual_nodes`` points (``xxh3_64("<replica id>#<i>")``). A request's
routing key is the chain hash of its first ``prefix_blocks`` KV blocks —
chain hashes fold in every earlier block, so that one hash names the whole
prefix. Requests sharing a prefix share a key and land on the same replica,
whose prefix cache then serves them all, with no index to keep.

To keep a popular prefix from overloading its replica, the walk goes
clockwise from the key and takes the first replica whose load *after*
taking this request stays within the bound::

    load(r) + 1 <= ceil(load_factor * (total_load + 1) / n)

where ``total_load`` sums the healthy replicas' load and ``n`` counts them.
The least loaded replica always qualifies (its load is at most the mean), so
the walk always ends and no replica ever exceeds the bound. KubeAI compares
``load + 1`` with the unrounded bound; rounding up lets small clusters at low
load still keep affinity.

Keys when the prompt is short: with fewer than ``prefix_blocks`` full blocks
the key is the hash of the blocks there are; with none, the hash of the
model and the session key (or the request id), so short prompts spread.

Decision reasons: ``hit`` (the key's own replica took it), ``load-fallback``
(it was over the bound; a later replica on the ring took it). Fallbacks are
the other healthy replicas in ring order from the key, which is where the key
would move if the chosen replica failed. Scores are the replicas' loads.

Parameters:

* ``prefix_blocks`` (default 4): leading blocks that form the key (64 tokens
  at vLLM's default block size: enough to tell system prompts apart).
* ``virtual_nodes`` (default 100): ring points per replica; more points,
  more even key spread.
* ``load_factor`` (default 1.25, KubeAI's): how far above the mean load a
  replica may go before keys spill to the next one; must be >= 1.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from policies.base import LoadOnly, healthy
from policies.bounded_load import load_bound
from policies.options import parse_options
from policies.types import Decision, ReplicaView, RouteRequest


@dataclass(frozen=True)
class ChwblConfig:
    prefix_blocks: int = 4
    virtual_nodes: int = 100
    load_factor: float = 1.25

    def __post_init__(self) -> None:
        if self.prefix_blocks < 1:
            raise ValueError("prefix_blocks must be at least 1")
        if self.virtual_nodes < 1:
            raise ValueError("virtual_nodes must be at least 1")
        if self.load_factor < 1.0:
            raise ValueError("load_factor must be at least 1")


class Chwbl(LoadOnly):
    name = "chwbl"
    uses_prefix = True

    def __init__(self, config: ChwblConfig | None = None) -> None:
        self.config = config or ChwblConfig()
        self._ring_members: tuple[str, ...] = ()
        self._ring_points: list[int] = []
        self._ring_owners: list[str] = []

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Chwbl:
        return cls(parse_options(ChwblConfig, options, cls.name))

    def routing_key(self, request: RouteRequest) -> int:
        if request.block_hashes:
            return request.block_hashes[
                min(self.config.prefix_blocks, len(request.block_hashes)) - 1
            ]
        spread = request.session_key if request.session_key is not None else request.request_id
        return xxhash.xxh3_64_intdigest(f"{request.model}\x00{spread}".encode())

    def ring_order(self, key: int, replica_ids: Sequence[str]) -> list[str]:
        """Distinct replicas met walking clockwise from ``key``."""
        self._build_ring(tuple(sorted(replica_ids)))
        points, owners = self._ring_points, self._ring_owners
        start = bisect.bisect_left(points, key)
        order: list[str] = []
        seen: set[str] = set()
        ring_size = len(points)
        for step in range(ring_size):
            owner = owners[(start + step) % ring_size]
            if owner not in seen:
                seen.add(owner)
                order.append(owner)
                if len(order) == len(self._ring_members):
                    break
        return order

    def pick(self, request: RouteRequest, replicas: Sequence[ReplicaView]) -> Decision:
        candidates = {r.id: r for r in healthy(replicas)}
        order = self.ring_order(self.routing_key(request), list(candidates))
        total_load = sum(r.load for r in candidates.values())
        bound = load_bound(total_load, len(candidates), self.config.load_factor)
        chosen = next(rid for rid in order if candidates[rid].load + 1 <= bound)
        return Decision(
            replica_id=chosen,
            reason="hit" if chosen == order[0] else "load-fallback",
            fallbacks=tuple(rid for rid in order if rid != chosen),
            scores={rid: float(candidates[rid].load) for rid in order},
        )

    def _build_ring(self, members: tuple[str, ...]) -> None:
        if members == self._ring_members:
            return
        points = sorted(
            (xxhash.xxh3_64_intdigest(f"{replica_id}#{i}".encode()), replica_id)
            for replica_id in members
            for i in range(self.config.virtual_nodes)
        )
        self._ring_members = members
        self._ring_points = [point for point, _ in points]
        self._ring_owners = [owner for _, owner in points]
