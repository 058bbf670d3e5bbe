"""Everything one gateway instance holds, wired by ``create_app``.

No module globals: the app owns one ``GatewayState``; routes reach it through
the closure that built them. ``describe`` reduces a request to what routing
needs (the prefix module plugs its renderer and hasher in here) and moves
heavy prompt work off the event loop; ``record`` turns a finished request
into metrics, policy learning and one access-log line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import orjson

from engine.pool import ReplicaPool
from policies.types import RouteRequest

from .config import Settings
from .hashers import HasherSet
from .lint.service import LintService
from .metrics import GatewayMetrics
from .ops_stats import OpsStats
from .proxy import Outcome, Proxy
from .routing import Routed, Router

log = logging.getLogger("prefixgate.access")

OFFLOAD_CHARS = 8192
"""Text still to tokenize above which the work goes to a worker thread."""


class GatewayState:
    def __init__(self, settings: Settings, pool: ReplicaPool, router: Router, proxy: Proxy,
                 metrics: GatewayMetrics, hashers: HasherSet,
                 ops: OpsStats | None = None, lint: LintService | None = None) -> None:
        self.settings = settings
        self.pool = pool
        self.router = router
        self.proxy = proxy
        self.metrics = metrics
        self.started_at = time.time()
        self.hashers = hashers
        self.ops = ops if ops is not None else OpsStats()
        self.lint = lint

    def expected_models(self) -> list[str]:
        configured = [m.name for m in self.settings.models]
        configured += [r.model for r in self.settings.replicas if r.model]
        return list(dict.fromkeys(configured)) or self.pool.known_models()

    async def describe(self, model: str, body: Mapping[str, Any], kind: str,
                       session_key: str | None, request_id: str) -> RouteRequest:
        """What routing needs to know of a request: its whole prompt's blocks.

        The decision always sees every full block of the prompt, exactly as a
        full render and tokenize would give them: text shared with earlier
        requests can sit inside a piece never seen whole (a message that
        grows, a document with a new question appended), so no piece may be
        left out. Pieces tokenized before are memoized; a new piece reuses
        the tokens of the known piece it shares leading text with; what is
        left to tokenize goes to a worker thread when it is long, so the loop
        never stalls on it.
        """
        block_size = self.router.block_size(model)
        if not self.router.policy.uses_prefix:
            return RouteRequest(model, (), 0, block_size, session_key, request_id)
        hasher = self.hashers.get(model)
        plan = hasher.plan(model, body, kind, block_size)
        if plan is None:
            return RouteRequest(model, (), 0, block_size, session_key, request_id)
        if plan.missing_chars > OFFLOAD_CHARS:
            tokenized = await asyncio.to_thread(hasher.tokenize_missing, plan)
        else:
            tokenized = hasher.tokenize_missing(plan)
        request = hasher.finish(plan, tokenized, session_key, request_id)
        if hasher.work_pending:
            # Audits and learning, after the request has left (see api.after_request_leaves).
            asyncio.get_running_loop().call_soon(hasher.run_pending)
        return request

    async def lint_prefix(self, model: str, body: Mapping[str, Any], kind: str,
                          tenant: str | None) -> int | None:
        """Warnings in a chat request's stable prefix (the prompt linter); None when off."""
        if self.lint is None or kind != "chat":
            return None
        return await self.lint.check(model, body, tenant)

    @staticmethod
    def with_model(data: dict[str, Any], model: str) -> bytes:
        return orjson.dumps({**data, "model": model})

    @staticmethod
    def predicted_cached(routed: Routed, replica_id: str) -> int:
        blocks = routed.decision.matched_blocks.get(replica_id, 0)
        request = routed.request
        # vLLM always recomputes the prompt's last token, so a fully cached
        # prompt hits one block less than it holds.
        reusable = (max(request.prompt_tokens - 1, 0) // request.block_size) * request.block_size
        return min(blocks * request.block_size, reusable)

    def record(self, model: str, routed: Routed, outcome: Outcome, started: float) -> None:
        m = self.metrics
        replica = outcome.replica_id or "none"
        m.requests.labels(model, replica, str(outcome.status)).inc()
        elapsed = time.perf_counter() - started
        if outcome.status == 200 and outcome.replica_id:
            self.router.observe(routed, outcome.replica_id)
            m.request_seconds.labels(replica).observe(elapsed)
            predicted = self.predicted_cached(routed, replica)
            m.prompt_tokens.labels(replica).inc(routed.request.prompt_tokens)
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
            self.ops.record(outcome.replica_id, routed.request.prompt_tokens,
                            self.predicted_cached(routed, replica), outcome.ttft,
                            ok=outcome.status == 200)
        if log.isEnabledFor(logging.INFO):
            log.info(orjson.dumps({
                "request_id": routed.request.request_id, "model": model, "replica": replica,
                "policy": self.router.policy.name, "reason": routed.decision.reason,
                "status": outcome.status, "attempts": outcome.attempts,
                "prompt_tokens": routed.request.prompt_tokens,
                "matched_tokens": self.predicted_cached(routed, replica),
                "cached_tokens": outcome.usage.cached_tokens if outcome.usage else None,
                "ttft_s": round(outcome.ttft, 4) if outcome.ttft is not None else None,
                "total_s": round(elapsed, 4), "error": outcome.error,
            }).decode())
