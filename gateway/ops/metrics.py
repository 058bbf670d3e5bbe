"""Every Prometheus series the gateway exports is registered here.

The gateway's own counters and histograms are defined in
:class:`GatewayMetrics`. Series read at scrape time from the state they
describe come from collectors: the pool's (:class:`PoolCollector`: health,
load, the replicas' own vLLM counters) and the tokenizers' (:class:`HasherCollector`)
here, and beside the state they read, registered through
``GatewayMetrics.register`` at start-up (``gateway.server.parts``):
``breaker_metrics`` (circuit breakers), ``memo_metrics`` (memo sizes),
``fleet_metrics`` (Redis shared state) and ``auth`` (key rejections). Reading at scrape time keeps the numbers from drifting from the
state. The ops view reads this same registry (``gateway.ops.stats``).

Labels are bounded: replica, model, policy, reason, kind, status — never a
prompt, a user or a key. The lint and drift counters are defined here and
incremented by the prompt linter.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from engine.pool.replicas import ReplicaPool
from engine.pool.scrape import HistogramCounts
from gateway.ops.block_table import block_table_backend
from gateway.prompt.hashers import HasherSet

GATEWAY_ERROR_STATUSES = (400, 404, 413, 429, 502, 503, 504)
"""Statuses the gateway answers with itself (``gateway.errors``), counted from 0."""

_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0,
                    5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                 0.5, 0.75, 1.0, 2.5)
_FAST_BUCKETS = (0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015,
                 0.002, 0.0025, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)


class GatewayMetrics:
    def __init__(self, pool: ReplicaPool) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "prefixgate_requests", "Requests answered, by final HTTP status.",
            ["model", "replica", "status"], registry=r)
        self.request_seconds = Histogram(
            "prefixgate_request_duration_seconds", "Time from arrival to the last byte.",
            ["replica"], buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft_seconds = Histogram(
            "prefixgate_time_to_first_token_seconds",
            "Time from arrival to the first byte of the replica's answer (streaming).",
            ["replica"], buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot_seconds = Histogram(
            "prefixgate_time_per_output_token_seconds",
            "Mean time between output tokens after the first (streaming).",
            ["replica"], buckets=_TPOT_BUCKETS, registry=r)
        self.overhead_seconds = Histogram(
            "prefixgate_overhead_seconds",
            "Gateway time before the request leaves for the replica (parse, render, decide).",
            buckets=_FAST_BUCKETS, registry=r)
        self.added_ttft_seconds = Histogram(
            "prefixgate_added_ttft_seconds",
            "Gateway time on a stream's way to its first token: before the request leaves "
            "(read, parse, render, decide) plus relaying the replica's first chunk.",
            buckets=_FAST_BUCKETS, registry=r)
        self.loop_lag_seconds = Histogram(
            "prefixgate_event_loop_lag_seconds",
            "How late the gateway's event loop woke a task that was due (sampled every 100 ms).",
            buckets=_FAST_BUCKETS, registry=r)
        self.gc_pause_seconds = Histogram(
            "prefixgate_gc_pause_seconds",
            "Time each garbage collection held the gateway's process, by generation.",
            ["generation"], buckets=_FAST_BUCKETS, registry=r)
        self.decision_seconds = Histogram(
            "prefixgate_routing_decision_seconds", "Time the policy took to pick a replica.",
            ["policy"], buckets=_FAST_BUCKETS, registry=r)
        self.decisions = Counter(
            "prefixgate_routing_decisions", "Routing decisions by policy and reason.",
            ["policy", "reason"], registry=r)
        self.failovers = Counter(
            "prefixgate_failovers", "Requests moved to another replica before the first byte.",
            ["replica"], registry=r)
        self.not_retried = Counter(
            "prefixgate_requests_not_retried",
            "Requests a replica failed while holding them, with no progress there since they "
            "arrived, answered with an error instead of tried on another replica (such a "
            "request may be what stopped the replica).", ["replica"], registry=r)
        self.stream_errors = Counter(
            "prefixgate_stream_errors", "Streams that broke after the first byte.",
            ["replica"], registry=r)
        self.prompt_tokens = Counter(
            "prefixgate_prompt_tokens", "Prompt tokens routed to each replica (gateway's count).",
            ["replica"], registry=r)
        self.predicted_cached_tokens = Counter(
            "prefixgate_predicted_cached_tokens",
            "Prompt tokens the policy expected the replica to hold in its prefix cache.",
            ["replica"], registry=r)
        self.usage_prompt_tokens = Counter(
            "prefixgate_usage_prompt_tokens",
            "Prompt tokens as reported by the replica in usage.", ["replica"], registry=r)
        self.usage_cached_tokens = Counter(
            "prefixgate_usage_cached_tokens",
            "Cached prompt tokens reported by the replica (usage.prompt_tokens_details).",
            ["replica"], registry=r)
        self.completion_tokens = Counter(
            "prefixgate_completion_tokens", "Output tokens reported by the replica.",
            ["replica"], registry=r)
        self.lint_dropped = Counter(
            "prefixgate_lint_dropped", "Requests the live prompt linter skipped: its queue "
            "was full, its share of a core (lint.cpu_share) was spent, or its process had "
            "ended with them (it lints off the serving loop, and never holds a request "
            "back).", registry=r)
        self.lint_process_restarts = Counter(
            "prefixgate_lint_process_restarts", "Times the live prompt linter's own process "
            "ended and was started again.", registry=r)
        self.lint_findings = Counter(
            "prefixgate_lint_findings", "Prompt lint findings, by kind of finding.",
            ["kind"], registry=r)
        self.prefix_drift_events = Counter(
            "prefixgate_prefix_drift_events",
            "Times a stable prompt prefix (system prompt, tools) changed under a model.",
            ["model"], registry=r)
        self.block_table_info = Gauge(
            "prefixgate_block_table_info",
            "1 for the block table the prefix indexes run on: compiled (policies._blocktable) "
            "or python (the fallback where it was not built: about 20x slower).",
            ["backend"], registry=r)
        self.block_table_info.labels(block_table_backend()).set(1)
        self.pool = pool
        r.register(PoolCollector(pool))
        self._replica_series: dict[str, ReplicaSeries] = {}
        self._series: dict[object, dict[tuple[str, ...], Any]] = {}

    def register(self, *collectors: Collector) -> None:
        """Series read from other parts at scrape time (``gateway.server.parts``)."""
        for collector in collectors:
            self.registry.register(collector)

    def replica_series(self, replica: str) -> ReplicaSeries:
        """A replica's per-request series, looked up once."""
        series = self._replica_series.get(replica)
        if series is None:
            if len(self._replica_series) >= SERIES_KEPT:
                self._replica_series.clear()
            series = self._replica_series[replica] = ReplicaSeries(
                *(metric.labels(replica) for metric in (
                    self.request_seconds, self.ttft_seconds, self.tpot_seconds,
                    self.prompt_tokens, self.predicted_cached_tokens,
                    self.usage_prompt_tokens, self.usage_cached_tokens,
                    self.completion_tokens)))
        return series

    def series(self, metric: Any, *values: str) -> Any:
        """``metric.labels(*values)``, looked up once per label values."""
        kept = self._series.get(metric)
        if kept is None:
            kept = self._series[metric] = {}
        child = kept.get(values)
        if child is None:
            if len(kept) >= SERIES_KEPT:
                kept.clear()
            child = kept[values] = metric.labels(*values)
        return child

    def start_at_zero(self, lint_kinds: Iterable[str] = ()) -> None:
        """Give every counter a sample at 0 for the label values known at start-up.

        A series that does not exist reads "No data" in Grafana, and ``rate``
        over it is empty, so an error ratio or a failover panel would stay
        blank during exactly the outage it is for. Known values: each replica
        (its models), the gateway's own error statuses per served model
        (replica ``none``), each lint finding kind, each model's drift counter.
        """
        for replica in self.pool:
            rid = replica.id
            for counter in (self.failovers, self.not_retried, self.stream_errors,
                            self.prompt_tokens,
                            self.predicted_cached_tokens, self.usage_prompt_tokens,
                            self.usage_cached_tokens, self.completion_tokens):
                counter.labels(rid)
            for model in replica.models or ((replica.spec.model,) if replica.spec.model else ()):
                self.requests.labels(model, rid, "200")
        for model in self.pool.known_models():
            for status in GATEWAY_ERROR_STATUSES:
                self.requests.labels(model, "none", str(status))
            self.prefix_drift_events.labels(model)
        for kind in lint_kinds:
            self.lint_findings.labels(kind)


@dataclass(frozen=True, slots=True)
class ReplicaSeries:
    """The series a routed request's completion touches on its replica, each looked up
    once (``GatewayMetrics.replica_series``): ``labels()`` checks and converts its values
    and takes the metric's lock, and a completion touched eight of them."""

    request_seconds: Any
    ttft_seconds: Any
    tpot_seconds: Any
    prompt_tokens: Any
    predicted_cached_tokens: Any
    usage_prompt_tokens: Any
    usage_cached_tokens: Any
    completion_tokens: Any


SERIES_KEPT = 4096
"""Label values whose series are kept at hand (``GatewayMetrics.series``), per metric;
past it the memo starts again (the series themselves stay in the registry)."""


class PoolCollector(Collector):
    """Reads the pool at scrape time: health, load, and the replicas' own counters."""

    def __init__(self, pool: ReplicaPool) -> None:
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        healthy = GaugeMetricFamily("prefixgate_replica_healthy",
                                    "1 when the replica is in rotation.", labels=["replica"])
        inflight = GaugeMetricFamily("prefixgate_replica_inflight_requests",
                                     "Requests the gateway has open on the replica.",
                                     labels=["replica"])
        running = GaugeMetricFamily("prefixgate_replica_running_requests",
                                    "vllm:num_requests_running as last scraped.",
                                    labels=["replica"])
        waiting = GaugeMetricFamily("prefixgate_replica_waiting_requests",
                                    "vllm:num_requests_waiting as last scraped.",
                                    labels=["replica"])
        kv = GaugeMetricFamily("prefixgate_replica_kv_cache_usage_ratio",
                               "vllm:kv_cache_usage_perc (0-1) as last scraped.",
                               labels=["replica"])
        hits = CounterMetricFamily("prefixgate_replica_prefix_cache_hits_tokens",
                                   "vllm:prefix_cache_hits_total of the replica.",
                                   labels=["replica"])
        queries = CounterMetricFamily("prefixgate_replica_prefix_cache_queries_tokens",
                                      "vllm:prefix_cache_queries_total of the replica.",
                                      labels=["replica"])
        generated = CounterMetricFamily(
            "prefixgate_replica_generation_tokens",
            "vllm:generation_tokens_total of the replica: every output token it produced, "
            "streamed or not (prefixgate_completion_tokens counts only those in usage).",
            labels=["replica"])
        info = InfoMetricFamily("prefixgate_replica",
                                "Configured replica: the model it serves and its kind.",
                                labels=["replica", "model", "kind"])
        replicas = GaugeMetricFamily("prefixgate_replicas",
                                     "Replicas configured for a model.", labels=["model"])
        healthy_count = GaugeMetricFamily("prefixgate_healthy_replicas",
                                          "Replicas of a model in rotation.", labels=["model"])
        ttft = HistogramMetricFamily(
            "prefixgate_replica_time_to_first_token_seconds",
            "vllm:time_to_first_token_seconds of the replica (engine-side), as last scraped.",
            labels=["replica"])
        itl = HistogramMetricFamily(
            "prefixgate_replica_inter_token_latency_seconds",
            "vllm:inter_token_latency_seconds of the replica (engine-side), as last scraped.",
            labels=["replica"])
        per_model: dict[str, list[bool]] = {}
        for replica in self.pool:
            for model in replica.models or ("",):
                info.add_metric([replica.id, model, replica.spec.kind], {})
                if model:
                    per_model.setdefault(model, []).append(replica.healthy)
            _add_histogram(ttft, replica.id, replica.metrics.ttft)
            _add_histogram(itl, replica.id, replica.metrics.itl)
        for model, states in per_model.items():
            replicas.add_metric([model], len(states))
            healthy_count.add_metric([model], sum(states))
        yield from (info, replicas, healthy_count, ttft, itl)
        for replica in self.pool:
            labels = [replica.id]
            healthy.add_metric(labels, 1.0 if replica.healthy else 0.0)
            inflight.add_metric(labels, replica.inflight)
            running.add_metric(labels, replica.metrics.running)
            waiting.add_metric(labels, replica.metrics.waiting)
            kv.add_metric(labels, replica.metrics.kv_usage)
            hits.add_metric(labels, replica.metrics.prefix_hits)
            queries.add_metric(labels, replica.metrics.prefix_queries)
            generated.add_metric(labels, replica.metrics.generation_tokens)
        yield from (healthy, inflight, running, waiting, kv, hits, queries, generated)


def _add_histogram(family: HistogramMetricFamily, replica_id: str,
                   counts: HistogramCounts | None) -> None:
    if counts is None:
        return
    buckets = [(floatToGoString(le), value) for le, value in counts.buckets]
    family.add_metric([replica_id], buckets, counts.sum)


class HasherCollector(Collector):
    """Tokenizer choice and incremental chat rendering per model, read at scrape time."""

    def __init__(self, hashers: HasherSet) -> None:
        self.hashers = hashers

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "prefixgate_tokenizer_info",
            "1 per served model: where its tokenizer came from (config, replica-root, "
            "hf-cache, or bytes when none was found).", labels=["model", "source"])
        for model, choice in self.hashers.tokenizers().items():
            info.add_metric([model, str(choice["source"])], 1.0)
        yield info
        checks = GaugeMetricFamily(
            "prefixgate_render_check",
            "1 per served model and replica: whether the replica's /tokenize gives the token "
            "ids the gateway renders for the same chats (match, differs, unchecked).",
            labels=["model", "replica", "result"])
        for model, replica, check in self.hashers.render_checks():
            checks.add_metric([model, replica, check.result], 1.0)
        yield checks
        enabled = GaugeMetricFamily(
            "prefixgate_incremental_render_enabled",
            "1 when follow-ups are rendered from the last known turn (template verified).",
            labels=["model"])
        renders = CounterMetricFamily(
            "prefixgate_incremental_renders",
            "Chat requests rendered from a known turn instead of whole.", labels=["model"])
        failures = CounterMetricFamily(
            "prefixgate_render_audit_failures",
            "Sampled incremental renders that disagreed with a full render.", labels=["model"])
        fills = CounterMetricFamily(
            "prefixgate_template_fills",
            "Chat renders made from the recipe of a shape of conversation seen before.",
            labels=["model"])
        fill_failures = CounterMetricFamily(
            "prefixgate_template_fill_failures",
            "Sampled recipe fills that disagreed with a full render (one turns filling off "
            "for that template).", labels=["model"])
        for model, hasher in self.hashers.items():
            memo = hasher.conversations
            enabled.add_metric([model], 1.0 if memo is not None and memo.enabled else 0.0)
            renders.add_metric([model], memo.incremental if memo is not None else 0)
            failures.add_metric([model], memo.audit_failures if memo is not None else 0)
            shapes = getattr(hasher.renderer, "template_shapes", None)
            fills.add_metric([model], shapes.fills if shapes is not None else 0)
            fill_failures.add_metric([model], shapes.audit_failures if shapes is not None else 0)
        yield from (enabled, renders, failures, fills, fill_failures)
