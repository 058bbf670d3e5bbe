"""``create_app(settings)``: the one place where the gateway is wired together.

Nothing happens at import time. The lifespan builds one backend per replica,
the pool (and starts its probe loops), the policy from the registry, the
router, the proxy and the metrics, and tears them down in reverse order.
``transport`` lets tests put an ``httpx.MockTransport`` under every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging
import time
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from engine.backends.base import Backend
from engine.pool.discovery import Resolver, system_resolver
from engine.pool.replicas import ReplicaPool, ReplicaSpec
from gateway import errors
from gateway.auth.keys import AuthMiddleware, load_store, watching
from gateway.auth.shared import sharing
from gateway.config import Settings
from gateway.fleet.metrics import fleet_collectors
from gateway.fleet.publisher import FleetPublisher
from gateway.fleet.sync import fleet_of
from gateway.lint.ops import dashboard_feeds
from gateway.lint.service import LintLimits, LintService
from gateway.lint.suggest import SUGGESTIONS
from gateway.ops.breaker_metrics import BreakerCollector
from gateway.ops.loop_lag import GcPauses, LoopLagMeter
from gateway.ops.memo_metrics import MemoCollector
from gateway.ops.metrics import GatewayMetrics, HasherCollector
from gateway.ops.routes import build_ops_router
from gateway.ops.sampler import OpsSampler
from gateway.ops.stats import OpsStats
from gateway.ops.view import OpsView
from gateway.prompt.hashers import HasherSet, TokenizerConfigError
from gateway.replicas.capacity import planned_blocks
from gateway.replicas.inprocess import start_inprocess
from gateway.replicas.kv_feed import KVFeed
from gateway.replicas.sources import TransportFactory, build_discovery, follow_events, make_backend
from gateway.replicas.watch import ReplicaWatch
from gateway.request.decider import Decider
from gateway.request.dispatch import Dispatcher
from gateway.request.drain import Drain
from gateway.request.lifecycle import Lifecycle, RequestObserver
from gateway.request.preparing import Preparing
from gateway.request.proxy import Proxy
from gateway.request.recorder import Recorder, ResponseCounter
from gateway.request.response_homes import ResponseHomes
from gateway.request.state import GatewayState
from gateway.request.streaming import RAW_SEND
from gateway.server.lint_routes import build_lint_router
from gateway.server.live_lint import LiveLint
from gateway.server.openapi import describe_bodies
from gateway.server.routes import build_router
from gateway.server.trace_routes import build_trace_router
from gateway.trace.setup import build_trace
from policies.registry import default_registry

log = logging.getLogger("prefixgate")



def build_backends(settings: Settings,
                   transport: TransportFactory | None = None) -> list[tuple[ReplicaSpec, Backend]]:
    """One backend per replica; ``transport`` may supply each one's httpx transport."""
    timeouts = settings.timeouts.engine()
    out: list[tuple[ReplicaSpec, Backend]] = []
    for replica_id, cfg in zip(settings.replica_ids(), settings.replicas):
        spec = ReplicaSpec(id=replica_id, url=cfg.url, model=cfg.model, kind=cfg.kind,
                           block_size=cfg.block_size,
                           planned_blocks=planned_blocks(cfg.capacity) if cfg.capacity else 0)
        out.append((spec, make_backend(spec, timeouts, cfg.api_key, transport)))
    return out


FULL_GC_EVERY = 100
"""Collections of the middle generation between two full ones (Python's default: 10)."""


class GatewayApp(FastAPI):
    """FastAPI, plus the server's own ``send`` in the scope for stream relays.

    Starlette's error middlewares wrap ``send`` to learn whether a response
    has started; once a relay has sent its start through them, its body
    chunks (thousands a second under load) go straight to the server
    (``gateway.request.streaming``).
    """

    drain: Drain | None = None
    """Set by ``create_app``: while it drains, new routed requests are refused."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope[RAW_SEND] = send
        await self._counted(scope, receive, send)

    @functools.cached_property
    def _counted(self) -> ResponseCounter:
        return ResponseCounter(self._serve, self._metrics)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        drain = self.drain if scope["type"] == "http" else None
        refusal = drain.refusal(scope) if drain is not None else None
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def _metrics(self) -> GatewayMetrics | None:
        state = getattr(self.state, "gateway", None)
        return state.metrics if state is not None else None


def create_app(settings: Settings, transport: TransportFactory | None = None,
               resolver: Resolver = system_resolver) -> FastAPI:
    # Built here so that a wrong policy or option fails at start-up, not on a request.
    policy = default_registry(clock=time.monotonic).create(settings.policy_name(),
                                                           settings.policy_options)
    drain = Drain(settings.drain_seconds, settings.retry_after_seconds)
    keys = load_store(settings.api_keys, settings.tenant_salt_secret,
                      settings.retry_after_seconds)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as engines_stack:
            live, engines = await start_inprocess(settings, engines_stack)

            def transports(replica_id: str) -> httpx.AsyncBaseTransport | None:
                if replica_id in engines:
                    return engines[replica_id].transport
                return transport(replica_id) if transport else None

            async with _serving(app, live, transports), \
                    watching(keys, settings.api_keys_reload_seconds), \
                    sharing(keys, settings.redis_url, settings.redis_key_prefix):
                yield

    @contextlib.asynccontextmanager
    async def _serving(app: FastAPI, settings: Settings,
                       transport: TransportFactory) -> AsyncIterator[None]:
        pool = ReplicaPool(build_backends(settings, transport),
                           health_interval=settings.health_interval,
                           fail_threshold=settings.fail_threshold,
                           default_block_size=settings.default_block_size,
                           cooldown=settings.breaker.cooldown,
                           slow=settings.breaker.slow.engine())
        hashers = HasherSet(settings.models, default_tokenizer=settings.tokenizer,
                            limits=settings.limits)
        fleet = fleet_of(settings, pool, policy)
        metrics = GatewayMetrics(pool, extra=[HasherCollector(hashers), BreakerCollector(pool),
                                              MemoCollector(hashers, lambda: {
                                                  "compiled_templates": lint.clock_probe.compiled}),
                                              *(keys.metrics.collectors() if keys else []),
                                              *fleet_collectors(fleet)])
        router = Decider(pool, policy, metrics, retry_after=settings.retry_after_seconds)
        lint = LintService(hashers, settings.models, metrics,
                           limits=LintLimits(learn=settings.lint.learn,
                                             text_samples=settings.lint.text_samples))
        lint.clock_probe.compiled.resize(settings.limits.compiled_templates,
                                   settings.limits.compiled_template_bytes)
        homes = ResponseHomes()
        observers: list[RequestObserver] = [router, homes, Recorder(metrics, policy.name)]
        if fleet is not None:
            observers.append(FleetPublisher(fleet))
        preparing = Preparing()  # requests before their decision: the linter waits for them
        live_lint = LiveLint(lint, metrics, preparing) if settings.lint.enabled else None
        if live_lint is not None:
            observers.append(live_lint)
        trace = build_trace(settings.trace, policy.name)  # the traffic's shape (gateway.trace)
        if trace is not None:
            observers.append(trace.recorder)
            metrics.registry.register(trace.collector)
        proxy = Proxy(pool, metrics, settings.max_attempts, Lifecycle(observers),
                      timeouts=settings.timeouts.engine(), drain=drain)
        state = GatewayState(settings, pool, router, proxy, metrics, hashers, preparing)
        ops_sampler = OpsSampler(pool, metrics.registry, OpsStats())
        ops_view = OpsView(pool, policy, ops_sampler)
        ops_view.lint_provider, ops_view.drift_provider = dashboard_feeds(lint)
        ops_view.tokenizer_provider = hashers.tokenizers
        discovery = build_discovery(settings, pool, transport, resolver)
        await pool.start()
        await discovery.start()
        if fleet is not None:  # a restarted instance starts from the shared state
            await fleet.start()
            state.redis_status = ops_view.redis_provider = fleet.status
        try:
            await hashers.discover(pool.known_models(), pool.model_root)
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
                    hashers.notice(list(pool.get(replica_id).models), pool.model_root)
        pool.add_listener(new_models)
        metrics.start_at_zero(SUGGESTIONS if settings.lint.enabled else ())
        ops_sampler.start()
        lag_meter = LoopLagMeter(metrics.loop_lag_seconds)
        lag_meter.start()
        if live_lint is not None:
            live_lint.start()
        gc_pauses = GcPauses(metrics.gc_pause_seconds)
        gc_pauses.start()
        kv_feed = KVFeed(settings, pool, policy)
        await follow_events(discovery, settings, kv_feed)
        kv_feed.start()
        app.include_router(build_router(state, Dispatcher(state, homes)))
        app.include_router(build_ops_router(ops_view))
        app.include_router(build_lint_router(state, lint))
        app.include_router(build_trace_router(trace.writer if trace else None))
        app.state.gateway = state
        app.state.ops_view = ops_view
        # "ready", or "waiting for replicas" (and which cannot be reached)
        ReplicaWatch(pool, policy.name, f"http://{settings.host}:{settings.port}/v1").report()
        # What start-up loaded (modules, tokenizers, templates: ~120k objects)
        # leaves the cyclic collector's sight: a full collection walking it took
        # 100-145 ms. A full collection also walks every object of every open
        # stream (a few hundred each); Python starts one after 10 collections
        # of the middle generation, 100 makes them ten times rarer. Together
        # these cut the longest collection in the overhead benchmark's measured
        # rounds from <= 250 to <= 50 ms (prefixgate_gc_pause_seconds). Cyclic
        # garbage that outlives two collections just waits longer to be freed.
        gc.collect()
        gc.freeze()
        thresholds = gc.get_threshold()
        gc.set_threshold(thresholds[0], thresholds[1], max(thresholds[2], FULL_GC_EVERY))
        if trace is not None:
            trace.writer.start()
        try:
            yield
        finally:
            if trace is not None:  # what is queued is written, off the loop
                await asyncio.to_thread(trace.writer.stop)
            gc.unfreeze()
            gc.set_threshold(*thresholds)
            await discovery.aclose()
            await kv_feed.aclose()
            if fleet is not None:
                await fleet.aclose()
            await lag_meter.aclose()
            if live_lint is not None:
                await asyncio.to_thread(live_lint.close)
            gc_pauses.stop()
            await ops_sampler.aclose()
            await pool.aclose()
            await hashers.aclose()

    app = GatewayApp(title="prefixgate", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")
    describe_bodies(app)
    app.drain = drain
    errors.install(app)
    if keys is not None:
        app.add_middleware(AuthMiddleware, store=keys, metrics_auth=settings.metrics_auth)
    return app
