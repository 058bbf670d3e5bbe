"""What the gateway does with a finished exchange: learning, metrics, one log line.

``Recorder.record(exchange)`` runs once per routed request, when its last
byte is sent (or it failed): the policy's ``observe`` for the replica that
really answered (``Router.observe``; failover included), the per-replica
counters and histograms of ``gateway.metrics``, the ops view's rolling
stats, and, when the access log is on, one JSON line without prompt text.

Why the policy learns at the end and not when the request is sent: learning
at send time keeps a burst of requests with a new prefix together (+3.5
points of hit rate on shared-prefix), but with many users sharing a system
prompt it piles every new conversation onto the first replica that got it
(multi-turn, 12 users at once: 2 of 4 replicas took all 240 requests, the
hit rate fell 6 points and throughput halved; BENCHMARKS.md "Routing on
every request shape"). Learning at the end spreads a burst first, and each
replica learns the shared prefix once.
"""

from __future__ import annotations

import logging
import time

import orjson

from .exchange import Exchange
from .metrics import GatewayMetrics
from .ops_stats import OpsStats
from .routing import Router

log = logging.getLogger("prefixgate.access")


class Recorder:
    def __init__(self, metrics: GatewayMetrics, router: Router, ops: OpsStats) -> None:
        self.metrics = metrics
        self.router = router
        self.ops = ops

    def record(self, exchange: Exchange) -> None:
        m, outcome, request = self.metrics, exchange.outcome, exchange.request
        replica = outcome.replica_id or "none"
        m.requests.labels(exchange.model, replica, str(outcome.status)).inc()
        elapsed = time.perf_counter() - exchange.started
        predicted = exchange.predicted_cached(replica)
        prompt_tokens = request.prompt_tokens if request is not None else 0
        if outcome.status == 200 and outcome.replica_id:
            if request is not None and exchange.decision is not None:
                self.router.observe(request, exchange.decision, outcome.replica_id)
            m.request_seconds.labels(replica).observe(elapsed)
            m.prompt_tokens.labels(replica).inc(prompt_tokens)
            m.predicted_cached_tokens.labels(replica).inc(predicted)
            if outcome.ttft is not None:
                m.ttft_seconds.labels(replica).observe(outcome.ttft)
                if outcome.output_tokens > 1:
                    m.tpot_seconds.labels(replica).observe(
                        (elapsed - outcome.ttft) / (outcome.output_tokens - 1))
            if outcome.usage is not None:
                m.usage_prompt_tokens.labels(replica).inc(outcome.usage.prompt_tokens)
                m.completion_tokens.labels(replica).inc(outcome.usage.completion_tokens)
                if outcome.usage.cached_tokens is not None:
                    m.usage_cached_tokens.labels(replica).inc(outcome.usage.cached_tokens)
        if outcome.replica_id:
            self.ops.record(outcome.replica_id, prompt_tokens, predicted, outcome.ttft,
                            ok=outcome.status == 200)
        if log.isEnabledFor(logging.INFO):
            decision = exchange.decision
            log.info(orjson.dumps({
                "request_id": exchange.request_id, "model": exchange.model, "replica": replica,
                "policy": self.router.policy.name,
                "reason": decision.reason if decision is not None else None,
                "status": outcome.status, "attempts": outcome.attempts,
                "prompt_tokens": prompt_tokens, "matched_tokens": predicted,
                "cached_tokens": outcome.usage.cached_tokens if outcome.usage else None,
                "ttft_s": round(outcome.ttft, 4) if outcome.ttft is not None else None,
                "total_s": round(elapsed, 4), "error": outcome.error,
            }).decode())
