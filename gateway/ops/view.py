"""The operator's picture of every replica, as served by ``GET /admin/replicas``.

``OpsView.payload()`` joins three sources, all read without awaiting:

* the pool: configuration (id, url, model, kind), health, load, KV usage,
  block size and capacity, KV cache dtype (``cache_dtype`` of the replica's
  ``vllm:cache_config_info``; ``null`` when it publishes none), the last
  probe error;
* the policy's prefix index, when it has one: blocks the gateway believes
  each replica holds (``policy.indexed_blocks(replica)``; ``null`` for policies
  without an index, such as ``least_load``);
* the tokenizer each replica's model is rendered with (``tokenizer_provider``:
  ``{"source", "path"}``, see ``gateway.prompt.hashers``);
* the gateway's own load (``"gateway"``: CPU in cores over the last minute,
  event-loop lag p99, time before a request leaves p99, requests being
  prepared, open, waiting for the linter; ``gateway.ops.load``);
* :class:`OpsStats`, read from the same metrics registry ``/metrics``
  exports (``OpsSampler``): predicted and actual prefix-cache hit rates over
  the last minute and since start; over the last minute the gateway's TTFT
  and TPOT p50/p99 (streams), the engine's own TTFT and inter-token latency
  p50 (every request, streamed or not), output tokens per second; request
  counts, and the chart history.

Two hooks let the prompt linter show its findings without this module
knowing it: ``lint_provider`` returns the most frequent findings by kind and
``drift_provider`` the latest prefix-drift events. Both return nothing unless
given (``gateway.server.parts.build_ops_view`` gives the linter's:
``gateway.lint.ops``).
Neither may carry prompt text: kinds, counts, models, short fixed wording.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.pool.replicas import Replica, ReplicaPool
from gateway.ops.sampler import OpsSampler
from gateway.ops.stats import HistoryPoint, ReplicaStats, Totals
from policies.base import Policy

TOP_LINT_FINDINGS = 10
LATEST_DRIFT_EVENTS = 20


@dataclass(frozen=True, slots=True)
class LintFindingStat:
    """How often one kind of prompt-lint finding was seen."""

    kind: str
    """Bounded finding kind, e.g. ``timestamp_in_system_prompt``."""
    count: int
    severity: str = "warning"
    suggestion: str = ""
    """The fix in words; never text taken from a prompt."""


@dataclass(frozen=True, slots=True)
class DriftNotice:
    """A stable prefix (system prompt, tool list) changed under a model."""

    at: float
    """Unix time of the event."""
    model: str
    kind: str
    """What drifted, e.g. ``system_prompt`` or ``tools``."""
    detail: str = ""
    lost_tokens: int | None = None
    """Cached prefix tokens the change made useless, when known."""


LintProvider = Callable[[], Sequence[LintFindingStat]]
DriftProvider = Callable[[], Sequence[DriftNotice]]
TokenizerProvider = Callable[[], Mapping[str, Mapping[str, "str | None"]]]
"""Per model, where its tokenizer came from (``HasherSet.tokenizers``)."""


def _none() -> Sequence[Any]:
    return ()


class OpsView:
    def __init__(self, pool: ReplicaPool, policy: Policy, sampler: OpsSampler,
                 wall_clock: Callable[[], float] = time.time, *,
                 lint_provider: LintProvider = _none, drift_provider: DriftProvider = _none,
                 tokenizer_provider: TokenizerProvider = dict,
                 redis_provider: Callable[[], Mapping[str, object]] | None = None) -> None:
        self.pool = pool
        self.policy = policy
        self.sampler = sampler
        self.stats = sampler.stats
        self.wall_clock = wall_clock
        self.started_at = wall_clock()
        self.lint_provider = lint_provider
        self.drift_provider = drift_provider
        self.tokenizer_provider = tokenizer_provider
        self.redis_provider = redis_provider
        """Shared routing state's status (``FleetSync.status``); None without Redis."""

    def payload(self) -> dict[str, Any]:
        now = self.stats.clock()
        readings, load = self.sampler.readings()
        by_id = {s.replica_id: s for s in self.stats.stats(readings)}
        tokenizers = self.tokenizer_provider()
        # The readings' in-flight count: every worker's requests with several workers.
        inflight = {reading.replica_id: reading.inflight for reading in readings}
        replicas = [self._replica(r, by_id[r.id], now, tokenizers, inflight.get(r.id))
                    for r in self.pool]
        lint = sorted(self.lint_provider(), key=lambda f: (-f.count, f.kind))
        drift = sorted(self.drift_provider(), key=lambda e: -e.at)
        wall = self.wall_clock()
        return {
            "generated_at": wall,
            "uptime_s": _round(wall - self.started_at),
            "policy": self.policy.name,
            "window_s": self.stats.window,
            "sample_interval_s": self.stats.interval,
            "replicas_total": len(replicas),
            "replicas_healthy": sum(1 for r in replicas if r["healthy"]),
            "replicas": replicas,
            "redis": dict(self.redis_provider()) if self.redis_provider is not None else None,
            "gateway": self.sampler.load.summary(load),
            "lint_findings": [
                {"kind": f.kind, "count": f.count, "severity": f.severity,
                 "suggestion": f.suggestion}
                for f in lint[:TOP_LINT_FINDINGS]],
            "drift_events": [
                {"at": e.at, "age_s": _round(wall - e.at), "model": e.model, "kind": e.kind,
                 "detail": e.detail, "lost_tokens": e.lost_tokens}
                for e in drift[:LATEST_DRIFT_EVENTS]],
        }

    def _replica(self, replica: Replica, stats: ReplicaStats, now: float,
                 tokenizers: Mapping[str, Mapping[str, str | None]],
                 inflight: int | None = None) -> dict[str, Any]:
        m = replica.metrics
        block_size = replica.block_size(self.pool.default_block_size)
        capacity = replica.capacity_blocks or None
        models = list(replica.models)
        return {
            "id": replica.id,
            "url": replica.spec.url,
            "model": models[0] if models else None,
            "models": models,
            "tokenizer": dict(tokenizers[models[0]]) if models and models[0] in tokenizers
            else None,
            "kind": replica.spec.kind,
            "healthy": replica.healthy,
            "inflight": replica.inflight if inflight is None else inflight,
            **_pending(self.pool, replica),
            "running": m.running,
            "waiting": m.waiting,
            "kv_usage": _round(m.kv_usage),
            "block_size": block_size,
            "capacity_blocks": capacity,
            "capacity_tokens": capacity * block_size if capacity is not None else None,
            "capacity_source": replica.capacity_source,
            "kv_cache_dtype": m.kv_cache_dtype,
            "indexed_blocks": self.policy.indexed_blocks(replica.id),
            **_rates(stats.window, "1m"),
            **_rates(stats.total, "total"),
            **_latencies(stats.window, "1m"),
            "output_tokens_per_s_1m": _round(stats.output_tokens_per_s, 2),
            "last_error": replica.last_error,
            "history": _history(stats.history, now),
        }


def _pending(pool: ReplicaPool, replica: Replica) -> dict[str, Any]:
    """The gateway's requests there not yet prefilled, their prefill left, the replica's
    prefill speed as its times to first token say (``engine.pool.slow``), and the speed
    that prefill is assumed to drain at (the cost model's ``prefill_seconds_per_token``):
    far apart, the option is worth setting nearer the measured one."""
    requests, tokens = pool.pending_prefill(replica.id)
    speed = replica.measured_seconds_per_token
    return {"pending_requests": requests, "pending_prefill_tokens": tokens,
            "prefill_tokens_per_s": _round(1.0 / speed, 0) if speed else None,
            "assumed_prefill_tokens_per_s": _round(1.0 / pool.prefill_seconds_per_token, 0)}


def _rates(totals: Totals, suffix: str) -> dict[str, Any]:
    return {
        f"predicted_hit_rate_{suffix}": _round(totals.predicted_hit_rate),
        f"actual_hit_rate_{suffix}": _round(totals.actual_hit_rate),
        f"requests_{suffix}": totals.requests,
        f"errors_{suffix}": totals.errors,
        f"prompt_tokens_{suffix}": totals.prompt_tokens,
        f"predicted_cached_tokens_{suffix}": totals.predicted_cached_tokens,
        f"cache_queries_tokens_{suffix}": totals.cache_queries,
        f"cache_hits_tokens_{suffix}": totals.cache_hits,
        f"completion_tokens_{suffix}": totals.completion_tokens,
    }


def _latencies(window: Totals, suffix: str) -> dict[str, Any]:
    """Quantiles over the window: the gateway's (streams) and the engine's (all requests)."""
    return {
        f"ttft_p50_{suffix}_s": _round(window.quantile("ttft", 0.5)),
        f"ttft_p99_{suffix}_s": _round(window.quantile("ttft", 0.99)),
        f"ttft_samples_{suffix}": window.samples("ttft"),
        f"tpot_p50_{suffix}_s": _round(window.quantile("tpot", 0.5)),
        f"tpot_p99_{suffix}_s": _round(window.quantile("tpot", 0.99)),
        f"engine_ttft_p50_{suffix}_s": _round(window.quantile("engine_ttft", 0.5)),
        f"engine_ttft_p99_{suffix}_s": _round(window.quantile("engine_ttft", 0.99)),
        f"engine_itl_p50_{suffix}_s": _round(window.quantile("engine_itl", 0.5)),
    }


def _history(points: Sequence[HistoryPoint], now: float) -> dict[str, list[Any]]:
    """Columns for the charts, oldest first; ``age_s`` is seconds before now."""
    return {
        "age_s": [_round(now - p.at, 2) for p in points],
        "healthy": [p.healthy for p in points],
        "predicted_hit_rate": [_round(p.predicted_hit_rate) for p in points],
        "actual_hit_rate": [_round(p.actual_hit_rate) for p in points],
        "inflight": [p.inflight for p in points],
        "running": [p.running for p in points],
        "waiting": [p.waiting for p in points],
        "kv_usage": [_round(p.kv_usage) for p in points],
        "ttft_p50_s": [_round(p.ttft_p50) for p in points],
        "ttft_p99_s": [_round(p.ttft_p99) for p in points],
        "request_rate": [_round(p.request_rate, 3) for p in points],
        "output_tokens_per_s": [_round(p.output_tokens_per_s, 2) for p in points],
    }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)
