"""What the gateway does with a finished exchange: learning, metrics, one log line.

``Recorder.record(exchange)`` runs once per routed request, when its last
byte is sent (or it failed): the policy's ``observe`` for the replica that
really answered (``Router.observe``; failover included), the per-replica
counters and histograms of ``gateway.metrics`` (which the ops view reads
too: ``gateway.ops_stats``), and, when the access log is on, one JSON line
without prompt text.

``count_responses`` wraps the whole app: every answer that no exchange
recorded — the gateway's own errors (400, 404, 413, 502, 503, ...), refusals
before a request is routed — is counted in ``prefixgate_requests_total``
with replica ``none``, so the error panels see an outage, not a gap.

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
from collections.abc import Callable

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .exchange import MODEL, RECORDED, Exchange
from .metrics import GatewayMetrics
from .routing import Router

log = logging.getLogger("prefixgate.access")


class Recorder:
    def __init__(self, metrics: GatewayMetrics, router: Router) -> None:
        self.metrics = metrics
        self.router = router

    def record(self, exchange: Exchange) -> None:
        exchange.client.scope[RECORDED] = True
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
        if log.isEnabledFor(logging.INFO):
            decision = exchange.decision
            log.info(orjson.dumps({
                "request_id": exchange.request_id, "model": exchange.model, "replica": replica,
                "policy": self.router.policy.name,
                "reason": exchange.reason(replica) if decision is not None else None,
                "status": outcome.status, "attempts": outcome.attempts,
                "prompt_tokens": prompt_tokens, "matched_tokens": predicted,
                "cached_tokens": outcome.usage.cached_tokens if outcome.usage else None,
                "ttft_s": round(outcome.ttft, 4) if outcome.ttft is not None else None,
                "total_s": round(elapsed, 4), "error": outcome.error,
            }).decode())


UNCOUNTED_PATHS = ("/health", "/ready", "/metrics", "/admin", "/dashboard", "/openapi.json")
"""The gateway's own ops routes: not requests of the API, not in ``requests_total``."""


class ResponseCounter:
    """Wraps the app: counts each HTTP answer that no exchange recorded, by status."""

    def __init__(self, app: ASGIApp, metrics: Callable[[], GatewayMetrics | None]) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(UNCOUNTED_PATHS):
            await self.app(scope, receive, send)
            return
        seen = _Status(send)
        try:
            await self.app(scope, receive, seen)
        finally:
            m = self.metrics()
            if m is not None and seen.status and not scope.get(RECORDED):
                m.requests.labels(scope.get(MODEL) or "none", "none", str(seen.status)).inc()


class _Status:
    """A ``send`` that remembers the status it started a response with."""

    __slots__ = ("send", "status")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.status = 0

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)
