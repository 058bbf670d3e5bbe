"""What the gateway does with a finished exchange: metrics and one log line.

``Recorder`` observes each routed request's lifecycle (``gateway.request.lifecycle``)
and acts once, when it is complete (its last byte sent, or it failed): the
per-replica counters and histograms of ``gateway.ops.metrics`` (which the ops
view reads too: ``gateway.ops.stats``), and, when the access log is on, one
JSON line without prompt text. (What the policy learns is the decider's:
``gateway.request.decider``.)

Every other answer — the gateway's own errors (400, 404, 413, 502, 503,
...), refusals before a request is routed, the gateway's own routes — is
counted in ``prefixgate_requests_total`` by the front door, with replica
``none`` (``gateway.request.front``), so the error panels see an outage, not
a gap.
"""

from __future__ import annotations

import logging
import time

import orjson

from gateway.ops.metrics import GatewayMetrics
from gateway.request.exchange import Exchange
from gateway.request.lifecycle import Silent

log = logging.getLogger("prefixgate.access")


class Recorder(Silent):
    def __init__(self, metrics: GatewayMetrics, policy_name: str) -> None:
        self.metrics = metrics
        self.policy_name = policy_name

    def on_complete(self, exchange: Exchange) -> None:
        m, outcome, request = self.metrics, exchange.outcome, exchange.request
        replica = outcome.replica_id or "none"
        m.series(m.requests, exchange.model, replica, str(outcome.status)).inc()
        elapsed = time.perf_counter() - exchange.started
        predicted = exchange.predicted_cached(replica)
        prompt_tokens = request.prompt_tokens if request is not None else 0
        if outcome.status == 200 and outcome.replica_id:
            series = m.replica_series(replica)
            series.request_seconds.observe(elapsed)
            series.prompt_tokens.inc(prompt_tokens)
            series.predicted_cached_tokens.inc(predicted)
            if outcome.ttft is not None:
                series.ttft_seconds.observe(outcome.ttft)
                if outcome.output_tokens > 1:
                    series.tpot_seconds.observe(
                        (elapsed - outcome.ttft) / (outcome.output_tokens - 1))
            if outcome.usage is not None:
                series.usage_prompt_tokens.inc(outcome.usage.prompt_tokens)
                series.completion_tokens.inc(outcome.usage.completion_tokens)
                if outcome.usage.cached_tokens is not None:
                    series.usage_cached_tokens.inc(outcome.usage.cached_tokens)
        if log.isEnabledFor(logging.INFO):
            decision = exchange.decision
            log.info(orjson.dumps({
                "request_id": exchange.request_id, "model": exchange.model, "replica": replica,
                "policy": self.policy_name,
                "reason": exchange.reason(replica) if decision is not None else None,
                "status": outcome.status, "attempts": outcome.attempts,
                "prompt_tokens": prompt_tokens, "matched_tokens": predicted,
                "cached_tokens": outcome.usage.cached_tokens if outcome.usage else None,
                "ttft_s": round(outcome.ttft, 4) if outcome.ttft is not None else None,
                "total_s": round(elapsed, 4), "error": outcome.error,
            }).decode())
