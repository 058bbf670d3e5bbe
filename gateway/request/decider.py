"""The policy in the gateway: a parsed request's decision, and what the policy learns after.

``Decider.decide`` takes the pool's snapshot for the request's model, asks the
policy, and counts and times the decision. The decider also observes each
request's lifecycle (``gateway.request.lifecycle``) for the policy: an attempt
``sent`` to a replica puts the prompt's prefix on its way there
(``Policy.sent``); that replica's first byte confirms it (``Policy.prefilled``); an attempt
that failed first withdraws it (``Policy.abandoned``). Requests routed by
load carry no prompt blocks and teach the policy nothing. (What the other
gateway instances learn of it is another observer's: ``gateway.fleet.publisher``.)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.pool.replicas import ReplicaPool
from gateway.errors import NoHealthyReplica
from gateway.ops.metrics import GatewayMetrics
from gateway.request.exchange import Exchange
from policies.base import Policy
from policies.types import Decision, NoReplicaAvailable, RouteRequest


class Decider:
    def __init__(self, pool: ReplicaPool, policy: Policy, metrics: GatewayMetrics,
                 retry_after: int = 1,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.pool = pool
        self.policy = policy
        self.metrics = metrics
        self.retry_after = retry_after
        self.clock = clock
        pool.add_listener(self._on_health)

    def block_size(self, model: str) -> int:
        sizes = [r.block_size(self.pool.default_block_size)
                 for r in self.pool.serving(model) if r.healthy]
        return min(sizes) if sizes else self.pool.default_block_size

    def decide(self, route_request: RouteRequest, counted: bool = True) -> Decision:
        """The policy's decision on the pool's snapshot; ``counted``: timed and counted in
        the metrics (a request's second look, after a claim, is not)."""
        snapshot = self.pool.snapshot(route_request.model)
        if not any(view.healthy for view in snapshot):
            raise NoHealthyReplica(
                f"no healthy replica serves model {route_request.model!r}; retry shortly",
                headers={"retry-after": str(self.retry_after)},
            )
        start = self.clock()
        try:
            decision = self.policy.pick(route_request, snapshot)
        except NoReplicaAvailable as exc:
            raise NoHealthyReplica(str(exc), headers={"retry-after": str(self.retry_after)}) from None
        if counted:
            elapsed = self.clock() - start
            metrics, name = self.metrics, self.policy.name
            metrics.series(metrics.decision_seconds, name).observe(elapsed)
            metrics.series(metrics.decisions, name, decision.reason).inc()
        return decision

    # -- the request's lifecycle (gateway.request.lifecycle.RequestObserver) ------------

    def on_decided(self, exchange: Exchange) -> None:
        return None

    def on_sent(self, exchange: Exchange, replica_id: str) -> None:
        if exchange.request is not None and exchange.decision is not None:
            self.policy.sent(exchange.request, replica_id)

    def on_first_byte(self, exchange: Exchange, replica_id: str) -> None:
        request = exchange.request
        if request is not None and exchange.decision is not None:
            self.policy.prefilled(request, replica_id)

    def on_failed(self, exchange: Exchange, replica_id: str) -> None:
        if exchange.request is not None and exchange.decision is not None:
            self.policy.abandoned(exchange.request, replica_id)

    def on_complete(self, exchange: Exchange) -> None:
        return None

    def _on_health(self, replica_id: str, healthy: bool) -> None:
        if not healthy:
            self.policy.forget_replica(replica_id)
