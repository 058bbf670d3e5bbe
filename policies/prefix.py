"""prefix: route to the replica believed to hold the prompt's longest prefix.

The cache-aware policy (:mod:`policies.cache_aware`) on an index of what the
gateway itself routed (:class:`~policies.prefix_index.ApproximatePrefixIndex`:
an LRU per replica sized by that replica's real KV capacity and aged by a
TTL). No engine cooperation is needed; the price is that the index is a
guess: blocks evicted by the engine (or sent there by other clients) are only
learned through the TTL and the capacity bound. Capacities come with each
decision's snapshot (``ReplicaView.block_capacity``), so a pool that reports
them needs no extra wiring.

Options, beside those of :mod:`policies.cache_aware` and its scorer:

* ``index_ttl_seconds`` (default 300.0): an index entry untouched this long
  no longer counts as cached.
* ``default_capacity_blocks`` (default 8192): index capacity of a replica
  whose real KV capacity is not known (``block_capacity`` 0).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from policies.cache_aware import CacheAwarePolicy, parse_options_of
from policies.prefix_index import ApproximatePrefixIndex

NAME = "prefix"


@dataclass(frozen=True)
class PrefixIndexConfig:
    index_ttl_seconds: float = 300.0
    default_capacity_blocks: int = 8192


def prefix_policy(options: Mapping[str, Any] | None = None, *,
                  clock: Callable[[], float]) -> CacheAwarePolicy:
    parsed = parse_options_of(NAME, options or {}, PrefixIndexConfig)
    index = ApproximatePrefixIndex(ttl_seconds=parsed.index.index_ttl_seconds,
                                   default_capacity_blocks=parsed.index.default_capacity_blocks)
    return CacheAwarePolicy(NAME, index, parsed.scorer, parsed.policy, clock=clock)
