"""The gateway's parts, each built by a named constructor from what it needs.

``gateway.server.start`` composes them in order; nothing here starts a task
or holds a global. Each constructor takes the settings and the parts built
before it, and returns a part ready to start (or, for the listeners and
warnings, does its one thing at start-up).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import Iterator, Mapping

import httpx

from engine.backends.base import Backend
from engine.backends.inprocess import InProcessEngine
from engine.pool.replicas import ReplicaPool, ReplicaSpec
from gateway.auth.keys import KeyStore
from gateway.config import Settings
from gateway.fleet.metrics import fleet_collectors
from gateway.fleet.publisher import FleetPublisher
from gateway.fleet.shared import SharedRouting
from gateway.fleet.sync import FleetSync
from gateway.lint.ops import dashboard_feeds
from gateway.lint.service import LintLimits, LintService
from gateway.ops.breaker_metrics import BreakerCollector
from gateway.ops.memo_metrics import MemoCollector
from gateway.ops.metrics import GatewayMetrics, HasherCollector
from gateway.ops.sampler import OpsSampler
from gateway.ops.view import OpsView
from gateway.prompt.hashers import HasherSet, TokenizerConfigError
from gateway.replicas.capacity import planned_blocks
from gateway.replicas.sources import TransportFactory, make_backend
from gateway.request.decider import Decider
from gateway.request.lifecycle import RequestObserver
from gateway.request.recorder import Recorder
from gateway.request.response_homes import ResponseHomes
from gateway.trace.setup import Trace
from policies.base import Policy
from policies.cost_scorer import drain_seconds_per_token
from policies.registry import default_registry

log = logging.getLogger("prefixgate")

FULL_GC_EVERY = 100
"""Collections of the middle generation between two full ones (Python's default: 10)."""


def build_policy(settings: Settings) -> Policy:
    """The configured policy: a wrong name or option fails at start-up, not on a request."""
    return default_registry(clock=time.monotonic).create(settings.policy_name(),
                                                         settings.policy_options)


def replica_transports(engines: Mapping[str, InProcessEngine],
                       supplied: TransportFactory | None) -> TransportFactory:
    """Each replica's httpx transport: its in-process engine's, else what the caller
    supplied (a test's fake replica), else None (the HTTP backend)."""

    def transport(replica_id: str) -> httpx.AsyncBaseTransport | None:
        if replica_id in engines:
            return engines[replica_id].transport
        return supplied(replica_id) if supplied else None

    return transport


def build_backends(settings: Settings,
                   transport: TransportFactory | None = None) -> list[tuple[ReplicaSpec, Backend]]:
    """One backend per replica; ``transport`` may supply each one's httpx transport."""
    timeouts = settings.timeouts.engine()
    out: list[tuple[ReplicaSpec, Backend]] = []
    for replica_id, cfg in zip(settings.replica_ids(), settings.replicas):
        spec = ReplicaSpec(id=replica_id, url=cfg.url, model=cfg.model, kind=cfg.kind,
                           block_size=cfg.block_size,
                           planned_blocks=planned_blocks(cfg.capacity) if cfg.capacity else 0)
        out.append((spec, make_backend(spec, timeouts, settings.replica_key(cfg), transport)))
    return out


def build_pool(settings: Settings, transport: TransportFactory) -> ReplicaPool:
    return ReplicaPool(build_backends(settings, transport),
                       health_interval=settings.health_interval,
                       fail_threshold=settings.fail_threshold,
                       default_block_size=settings.default_block_size,
                       cooldown=settings.breaker.cooldown,
                       slow=settings.breaker.slow.engine(),
                       prefill_seconds_per_token=drain_seconds_per_token(settings.policy_options))


def build_hashers(settings: Settings) -> HasherSet:
    return HasherSet(settings.models, default_tokenizer=settings.tokenizer,
                     limits=settings.limits, default_chat_template=settings.chat_template)


def build_lint(settings: Settings, hashers: HasherSet, metrics: GatewayMetrics) -> LintService:
    limits = settings.limits
    return LintService(hashers, settings.models, metrics, limits=LintLimits(
        learn=settings.lint.learn, text_samples=settings.lint.text_samples,
        compiled_templates=limits.compiled_templates,
        compiled_template_bytes=limits.compiled_template_bytes))


def register_collectors(metrics: GatewayMetrics, pool: ReplicaPool, hashers: HasherSet,
                        lint: LintService, keys: KeyStore | None, fleet: FleetSync | None,
                        trace: Trace | None) -> None:
    """The series read from the other parts at scrape time, in ``/metrics``."""
    metrics.register(HasherCollector(hashers), BreakerCollector(pool),
                     MemoCollector(hashers, lint.memos),
                     *(keys.metrics.collectors() if keys else []), *fleet_collectors(fleet),
                     *([trace.collector] if trace else []))


def build_observers(decider: Decider, homes: ResponseHomes, metrics: GatewayMetrics,
                    policy: Policy, fleet: SharedRouting | None,
                    live_lint: RequestObserver | None,
                    trace: Trace | None) -> list[RequestObserver]:
    """Who hears each request's lifecycle, in the order they hear it."""
    observers: list[RequestObserver] = [decider, homes, Recorder(metrics, policy.name)]
    if fleet is not None:
        observers.append(FleetPublisher(fleet))
    if live_lint is not None:
        observers.append(live_lint)
    if trace is not None:
        observers.append(trace.recorder)  # the traffic's shape (gateway.trace)
    return observers


def build_ops_view(pool: ReplicaPool, policy: Policy, sampler: OpsSampler, lint: LintService,
                   hashers: HasherSet, fleet: FleetSync | None) -> OpsView:
    findings, drifts = dashboard_feeds(lint)
    return OpsView(pool, policy, sampler, lint_provider=findings, drift_provider=drifts,
                   tokenizer_provider=hashers.tokenizers,
                   redis_provider=fleet.status if fleet is not None else None)


async def discover_tokenizers(hashers: HasherSet, pool: ReplicaPool, policy: Policy) -> None:
    """Each served model's tokenizer, found once the replicas have answered; the ones
    that join later are noticed as they turn healthy."""
    hashers.parent_of = pool.model_parent
    try:
        await hashers.discover(pool.known_models(), pool.tokenizer_root)
    except TokenizerConfigError as exc:
        log.error("prefixgate: %s", exc)
        raise
    if policy.name == "precise":
        for model in pool.known_models():
            if not hashers.has_tokenizer(model):
                log.warning("policy precise: model %s has no tokenizer, so the replicas' "
                            "KV events cannot be matched to its prompts; its requests are "
                            "routed on the gateway's own routing (speculative entries) and "
                            "load only. Give --model %s --tokenizer PATH", model, model)

    def new_models(replica_id: str, healthy: bool) -> None:
        if healthy:
            with contextlib.suppress(TokenizerConfigError):
                hashers.notice(list(pool.get(replica_id).models), pool.tokenizer_root)

    pool.add_listener(new_models)


@contextlib.contextmanager
def startup_frozen() -> Iterator[None]:
    """What start-up loaded kept out of the cyclic collector's walks while serving.

    What start-up loaded (modules, tokenizers, templates: ~120k objects)
    leaves the cyclic collector's sight: a full collection walking it took
    100-145 ms. A full collection also walks every object of every open
    stream (a few hundred each); Python starts one after 10 collections of
    the middle generation, 100 makes them ten times rarer. Together these cut
    the longest collection in the overhead benchmark's measured rounds from
    <= 250 to <= 50 ms (prefixgate_gc_pause_seconds). Cyclic garbage that
    outlives two collections just waits longer to be freed.
    """
    gc.collect()
    gc.freeze()
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], max(thresholds[2], FULL_GC_EVERY))
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
