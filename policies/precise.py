"""precise: route on what the replicas' KV caches really hold, from their events.

The cache-aware policy (:mod:`policies.cache_aware`) on a
:class:`~policies.precise_index.PreciseIndex`: each vLLM replica publishes
KV-cache events; the gateway feeds them to the policy's event consumer (the
index), which replays them keyed by the gateway's own chain hashes (the
stored blocks' token ids are re-hashed, so the engine's hash algorithm does
not matter). ``record`` marks the routed blocks as *speculatively* present on
the chosen replica for a short TTL, so a burst of requests sharing a new
prefix stays together until the engine's events confirm the blocks.

Wiring (the gateway, ``gateway.replicas.kv_feed``): for each replica,
``event_consumer().set_model(replica_id, model)`` once its model is known,
then ``apply_events(replica_id, batch)`` for every decoded
:class:`~policies.events.EventBatch`; ``forget_replica`` when the replica goes
unhealthy (its blocks are dropped; models are kept) and after a replay gap the
subscriber cannot fill.

Options, beside those of :mod:`policies.cache_aware` and its scorer:

* ``speculative_ttl_seconds`` (default 2.0): how long routed blocks count as
  present without an event confirming them (0 disables speculation).
* ``max_blocks_per_replica`` (default 524_288): memory guard on the engine
  hash map of each replica (see :mod:`policies.precise_index`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from policies.cache_aware import CacheAwarePolicy, parse_options_of
from policies.precise_index import PreciseIndex

NAME = "precise"


@dataclass(frozen=True)
class PreciseIndexConfig:
    speculative_ttl_seconds: float = 2.0
    max_blocks_per_replica: int = 524_288


def precise_policy(options: Mapping[str, Any] | None = None, *,
                   clock: Callable[[], float]) -> CacheAwarePolicy:
    parsed = parse_options_of(NAME, options or {}, PreciseIndexConfig)
    index = PreciseIndex(speculative_ttl_seconds=parsed.index.speculative_ttl_seconds,
                         max_blocks_per_replica=parsed.index.max_blocks_per_replica)
    return CacheAwarePolicy(NAME, index, parsed.scorer, parsed.policy, clock=clock, events=index)
