"""Where the pool's replicas come from: the static list and DNS names (``replicas_from``).

:func:`make_backend` is the one place a replica's backend is chosen (a
supplied transport -- an in-process engine or a test's fake replica -- or the
production HTTP backend), for configured and discovered replicas alike.
:func:`build_discovery` turns ``replicas_from`` into an
:class:`engine.pool.discovery.DnsDiscovery` over the pool, and :func:`follow_events`
points the KV feed at each discovered replica that publishes events
(``tcp://ADDRESS:PORT`` from the source's ``kv_events``).
"""

from __future__ import annotations

from collections.abc import Callable

import httpx

from engine.backends.base import Backend, Timeouts
from engine.backends.httpx_client import HttpxBackend
from engine.backends.remote import RemoteBackend
from engine.pool.discovery import (
    DiscoveredReplica,
    DnsDiscovery,
    DnsSource,
    Resolver,
    system_resolver,
)
from engine.pool.replicas import ReplicaPool, ReplicaSpec
from gateway.config import KVEventSettings, Settings
from gateway.replicas.kv_feed import KVFeed

TransportFactory = Callable[[str], "httpx.AsyncBaseTransport | None"]


def make_backend(spec: ReplicaSpec, timeouts: Timeouts, api_key: str | None,
                 transport: TransportFactory | None) -> Backend:
    supplied = transport(spec.id) if transport else None
    if supplied is not None:  # an in-process engine, or a test's fake replica
        return HttpxBackend(spec.id, spec.url, timeouts, transport=supplied, api_key=api_key)
    return RemoteBackend(spec.id, spec.url, timeouts, api_key=api_key)


def dns_sources(settings: Settings) -> list[DnsSource]:
    return [DnsSource(name=s.dns, port=s.port, model=s.model, scheme=s.scheme,
                      id_prefix=s.id_prefix, block_size=s.block_size,
                      drain_seconds=s.drain_seconds, key=i)
            for i, s in enumerate(settings.replicas_from)]


def build_discovery(settings: Settings, pool: ReplicaPool, transport: TransportFactory | None,
                    resolver: Resolver = system_resolver) -> DnsDiscovery:
    timeouts = settings.timeouts.engine()

    def backend(source: DnsSource, spec: ReplicaSpec) -> Backend:
        return make_backend(spec, timeouts,
                            settings.replica_key(settings.replicas_from[source.key]), transport)

    return DnsDiscovery(dns_sources(settings), pool, backend, settings.health_interval, resolver)


async def follow_events(discovery: DnsDiscovery, settings: Settings, feed: KVFeed) -> None:
    """Follow every discovered replica's KV events while it is in the pool."""

    async def joined(member: DiscoveredReplica) -> None:
        kv = settings.replicas_from[member.source.key].kv_events
        if kv is None:
            return
        host = f"[{member.address}]" if ":" in member.address else member.address
        feed.follow(member.spec.id, KVEventSettings(
            endpoint=f"tcp://{host}:{kv.port}", topic=kv.topic,
            replay_endpoint=f"tcp://{host}:{kv.replay_port}" if kv.replay_port else None))

    await discovery.watch(joined, feed.unfollow)
