"""The running gateway: its parts built, started in order, stopped in reverse.

:func:`start_gateway` is what the app's lifespan runs (``gateway.server.app``).
It builds each part with what it needs (``gateway.server.parts``), starts
the ones with a life of their own, and registers each one's stop as it
starts, so the gateway stops in the reverse order, and a start-up that fails
half-way stops what had started::

    in-process engines    kind: inprocess replicas, their KV endpoints filled in
    pool                  every replica's backend, probe loops, leases, breakers
    hashers               the prompt's blocks, one hasher per model
    fleet                 the state shared through Redis (redis_url), or none
    siblings              the other workers of this gateway (--workers N), or none
    metrics, decider      every series; the policy, asked and taught
    linter                the prompt linter (its routes; live traffic, when on, in a
                          process of its own or a thread: lint.worker)
    trace                 the recorded traffic (trace.path), or none
    proxy, lifecycle      forwarding, and who hears each request: the decider,
                          response homes, the recorder, fleet, live linter, trace
    state, ops view       what the routes read
    discovery             replicas from DNS (replicas_from)
    start:                pool, discovery, fleet, tokenizers, render checks (the
                          replicas' token ids against the gateway's), counters at zero,
                          ops sampler, loop-lag meter, live linter, GC pauses,
                          KV feed
    api, front door       the gateway's own routes; every request's entry
    start:                the replicas' report, start-up objects frozen, trace,
                          the key file watched, the keys' limits shared
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from prometheus_client import generate_latest
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from engine.pool.discovery import Resolver
from gateway.auth.keys import KeyStore, watching
from gateway.auth.shared import sharing
from gateway.config import Settings
from gateway.fleet.local import WorkerRole, siblings_of
from gateway.fleet.metrics import worker_collectors
from gateway.fleet.sync import fleet_of
from gateway.lint.budget import CpuBudget
from gateway.lint.service import LintService
from gateway.lint.suggest import SUGGESTIONS
from gateway.ops.load import LoadCollector
from gateway.ops.loop_lag import GcPauses, LoopLagMeter
from gateway.ops.metrics import GatewayMetrics
from gateway.ops.sampler import OpsSampler
from gateway.ops.stats import OpsStats
from gateway.ops.view import OpsView
from gateway.ops.worker_readings import encode_readings, local_readings
from gateway.prompt.render_check import RenderChecker
from gateway.replicas.inprocess import start_inprocess
from gateway.replicas.kv_feed import KVFeed
from gateway.replicas.sources import TransportFactory, build_discovery, follow_events
from gateway.replicas.watch import ReplicaWatch
from gateway.request.decider import Decider
from gateway.request.dispatch import Dispatcher
from gateway.request.drain import Drain
from gateway.request.front import Front
from gateway.request.lifecycle import Lifecycle
from gateway.request.preparing import Preparing
from gateway.request.proxy import Proxy
from gateway.request.response_homes import ResponseHomes
from gateway.request.route_table import RouteTable
from gateway.request.state import GatewayState
from gateway.server.api import build_api
from gateway.server.lint_process import LintProcess
from gateway.server.live_lint import LiveLint
from gateway.server.parts import (
    build_hashers,
    build_lint,
    build_observers,
    build_ops_view,
    build_pool,
    discover_tokenizers,
    register_collectors,
    replica_transports,
    startup_frozen,
)
from gateway.server.vllm_routes import ROUTES
from gateway.trace.setup import build_trace
from policies.base import Policy


@dataclass(frozen=True, slots=True)
class Serving:
    """The running gateway, as its app serves it."""

    front: ASGIApp
    """Every HTTP request's entry: the front door (``gateway.request.front``), behind
    CORS when ``allowed_origins`` is set."""
    state: GatewayState
    ops_view: OpsView


def live_linter(settings: Settings, lint: LintService, metrics: GatewayMetrics,
                preparing: Preparing) -> LiveLint | LintProcess | None:
    """The live prompt linter ``lint.worker`` names; None with ``lint.enabled`` off."""
    if not settings.lint.enabled:
        return None
    share = settings.lint.cpu_share
    if settings.lint.worker == "process":
        return LintProcess(lint, metrics, cpu_share=share)
    return LiveLint(lint, metrics, preparing, budget=CpuBudget(share))


@contextlib.asynccontextmanager
async def start_gateway(settings: Settings, policy: Policy, keys: KeyStore | None,
                        drain: Drain, transport: TransportFactory | None,
                        resolver: Resolver, worker: WorkerRole | None = None
                        ) -> AsyncIterator[Serving]:
    async with contextlib.AsyncExitStack() as stack:
        live, engines = await start_inprocess(settings, stack)
        transports = replica_transports(engines, transport)
        pool = build_pool(live, transports)
        hashers = build_hashers(live)
        stack.push_async_callback(hashers.aclose)
        metrics = GatewayMetrics(pool)
        fleet = fleet_of(live, pool, policy)
        # With Redis the workers share routing state through it, as instances do; the hub
        # then only merges their metrics.
        siblings = siblings_of(
            worker, pool, policy, lambda: generate_latest(metrics.registry),
            lambda: encode_readings(local_readings(metrics.registry, (r.id for r in pool))),
            share_routing=fleet is None)
        shared = fleet or (siblings if siblings is not None and siblings.share_routing else None)
        decider = Decider(pool, policy, metrics, retry_after=live.retry_after_seconds)
        lint = build_lint(live, hashers, metrics)
        preparing = Preparing()  # requests before their decision: the linter waits for them
        live_lint = live_linter(live, lint, metrics, preparing)
        trace = build_trace(live.trace, policy.name)
        register_collectors(metrics, pool, hashers, lint, keys, fleet, trace)
        metrics.register(*worker_collectors(
            siblings, worker.connections if worker is not None else None))
        metrics.register(LoadCollector(  # the gateway's own saturation (gateway.ops.load)
            lambda: preparing.count, drain.in_flight,
            live_lint.queued if live_lint is not None else None))
        homes = ResponseHomes()
        lifecycle = Lifecycle(build_observers(decider, homes, metrics, policy, shared,
                                              live_lint, trace))
        proxy = Proxy(pool, metrics, live.max_attempts, lifecycle,
                      timeouts=live.timeouts.engine(), drain=drain)
        state = GatewayState(live, pool, decider, proxy, metrics, hashers, preparing,
                             redis_status=fleet.status if fleet is not None else None,
                             workers=siblings)
        ops_sampler = OpsSampler(pool, metrics.registry, OpsStats(),
                                 merged=siblings.sampled_readings if siblings is not None else None)
        ops_view = build_ops_view(pool, policy, ops_sampler, lint, hashers, fleet)
        discovery = build_discovery(live, pool, transports, resolver)

        await pool.start()
        stack.push_async_callback(pool.aclose)
        await discovery.start()
        stack.push_async_callback(discovery.aclose)
        if fleet is not None:  # a restarted instance starts from the shared state
            await fleet.start()
            stack.push_async_callback(fleet.aclose)
        if siblings is not None:  # a restarted worker starts from what the others know
            await siblings.start()
            stack.push_async_callback(siblings.aclose)
        await discover_tokenizers(hashers, pool, policy)
        render_checker = RenderChecker(hashers, pool)  # same token ids as the replicas?
        render_checker.start()
        stack.push_async_callback(render_checker.aclose)
        metrics.start_at_zero(SUGGESTIONS if live.lint.enabled else ())
        ops_sampler.start()
        stack.push_async_callback(ops_sampler.aclose)
        loop_lag = LoopLagMeter(metrics.loop_lag_seconds)
        loop_lag.start()
        stack.push_async_callback(loop_lag.aclose)
        if isinstance(live_lint, LintProcess):
            live_lint.start()
            stack.push_async_callback(live_lint.aclose)
        elif live_lint is not None:
            live_lint.start()
            stack.push_async_callback(asyncio.to_thread, live_lint.close)
        gc_pauses = GcPauses(metrics.gc_pause_seconds)
        gc_pauses.start()
        stack.callback(gc_pauses.stop)
        kv_feed = KVFeed(live, pool, policy)
        await follow_events(discovery, live, kv_feed)
        kv_feed.start()
        stack.push_async_callback(kv_feed.aclose)

        api = build_api(state, ops_view, lint, trace.writer if trace else None,
                        admin_keys=keys is not None,
                        lint_groups=(live_lint.group_summaries
                                     if isinstance(live_lint, LintProcess) else None))
        front = Front(api, RouteTable(ROUTES), state, Dispatcher(state, homes), drain, keys,
                      live.metrics_auth)
        entry: ASGIApp = front
        if live.allowed_origins:  # CORS as vLLM answers it; without it, not a call more
            entry = CORSMiddleware(front, allow_origins=live.allowed_origins,
                                   allow_credentials=live.allow_credentials,
                                   allow_methods=live.allowed_methods,
                                   allow_headers=live.allowed_headers)
        # "ready", or "waiting for replicas" (and which cannot be reached)
        ReplicaWatch(pool, policy.name, f"http://{live.host}:{live.port}/v1",
                     tuple(source.dns for source in live.replicas_from)).report()
        stack.enter_context(startup_frozen())
        if trace is not None:
            trace.writer.start()  # what is queued at the end is written, off the loop
            stack.push_async_callback(asyncio.to_thread, trace.writer.stop)
        await stack.enter_async_context(watching(keys, live.api_keys_reload_seconds))
        await stack.enter_async_context(sharing(keys, live.redis_url, live.redis_key_prefix))
        yield Serving(entry, state, ops_view)
