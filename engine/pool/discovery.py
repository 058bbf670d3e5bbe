"""Replicas from DNS: every address a name resolves to is a replica.

A headless Kubernetes Service (``clusterIP: None``) answers its name with one
record per ready pod, so the name *is* the replica set. :class:`DnsDiscovery`
resolves each :class:`DnsSource` every ``interval`` seconds (the gateway uses
its health interval) and reconciles the pool with the answer:

* an address that appears **joins**: a :class:`ReplicaSpec` with id
  ``PREFIX-ADDRESS`` (``PREFIX`` defaults to the name's first label) and url
  ``scheme://ADDRESS:PORT``, probed once at once and then by its own loop
  (``ReplicaPool.add_replica``); ``on_join`` hooks hear of it after that.
* an address that vanishes **leaves**: ``on_leave`` hooks first (the gateway
  stops following its KV events), then ``ReplicaPool.remove_replica`` takes
  it out of rotation at once, lets its in-flight requests finish (up to the
  source's ``drain_seconds``) and only then drops it. An address that comes
  back while still draining joins on the first round after the drain ends.
* a name that does not exist (``EAI_NONAME``: NXDOMAIN, no records) is an
  empty set: its replicas leave. Any other failure (timeout, resolver down)
  keeps the current set, logged once until the name resolves again, so a DNS
  blip never empties the pool.

``resolver(host, port) -> addresses`` is injectable (tests hand in a
function over a dict); the default is the system resolver through
``loop.getaddrinfo``, which runs in the loop's executor and never blocks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from engine.backends.base import Backend
from engine.pool.replicas import ReplicaPool, ReplicaSpec
from engine.tasks import cancel

log = logging.getLogger("prefixgate.discovery")

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
BackendFactory = Callable[["DnsSource", ReplicaSpec], Backend]


@dataclass(frozen=True, slots=True)
class DnsSource:
    name: str
    port: int
    model: str | None = None
    scheme: str = "http"
    id_prefix: str | None = None
    block_size: int | None = None
    drain_seconds: float = 30.0
    key: int = 0
    """Which configured source this is (the gateway's index into ``replicas_from``)."""

    @property
    def prefix(self) -> str:
        return self.id_prefix or self.name.split(".", 1)[0]

    def replica_id(self, address: str) -> str:
        return f"{self.prefix}-{address}"

    def url(self, address: str) -> str:
        host = f"[{address}]" if ":" in address else address  # IPv6 in brackets
        return f"{self.scheme}://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class DiscoveredReplica:
    source: DnsSource
    address: str
    spec: ReplicaSpec


JoinHook = Callable[[DiscoveredReplica], Awaitable[None]]
LeaveHook = Callable[[str], Awaitable[None]]


async def system_resolver(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, deduplicated and sorted."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class DnsDiscovery:
    def __init__(self, sources: Sequence[DnsSource], pool: ReplicaPool,
                 make_backend: BackendFactory, interval: float,
                 resolver: Resolver = system_resolver) -> None:
        self.sources = tuple(sources)
        self.pool = pool
        self.interval = interval
        self._make_backend = make_backend
        self._resolve = resolver
        self._members: dict[str, DiscoveredReplica] = {}
        self._draining: dict[str, asyncio.Task[None]] = {}
        self._failing: set[str] = set()
        self._joins: list[JoinHook] = []
        self._leaves: list[LeaveHook] = []
        self._loop_task: asyncio.Task[None] | None = None
        self.rounds = 0

    def members(self) -> list[DiscoveredReplica]:
        return list(self._members.values())

    async def watch(self, on_join: JoinHook, on_leave: LeaveHook) -> None:
        """Hear of every replica that joins (the present ones at once) and leaves."""
        for member in self.members():
            await on_join(member)
        self._joins.append(on_join)
        self._leaves.append(on_leave)

    async def start(self) -> None:
        """Resolve every source once (so the first replicas are known), then keep at it."""
        await self.refresh()
        self._loop_task = asyncio.create_task(self._run(), name="dns-discovery")

    async def aclose(self) -> None:
        tasks = [t for t in (self._loop_task, *self._draining.values()) if t is not None]
        await cancel(*tasks)
        self._loop_task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.refresh()
            except Exception:  # a bug here must not stop discovery for good
                log.exception("replica discovery round failed")

    async def refresh(self) -> None:
        """One round: resolve every source and reconcile the pool with the answers."""
        self.rounds += 1
        for source in self.sources:
            addresses = await self._addresses(source)
            if addresses is None:
                continue
            wanted = {source.replica_id(a): a for a in addresses}
            mine = [m.spec.id for m in self._members.values() if m.source == source]
            for replica_id in mine:
                if replica_id not in wanted:
                    await self._leave(replica_id)
            for replica_id, address in wanted.items():
                if replica_id not in self._members and replica_id not in self._draining:
                    await self._join(source, replica_id, address)

    async def _addresses(self, source: DnsSource) -> list[str] | None:
        """The source's addresses; ``[]`` for a name that does not exist, ``None`` on failure."""
        try:
            found = sorted(set(await self._resolve(source.name, source.port)))
        except socket.gaierror as exc:
            if exc.errno != socket.EAI_NONAME:
                self._failed(source, exc)
                return None
            found = []
        except OSError as exc:
            self._failed(source, exc)
            return None
        if source.name in self._failing:
            self._failing.discard(source.name)
            log.info("replica discovery: %s resolves again", source.name)
        return found

    def _failed(self, source: DnsSource, exc: OSError) -> None:
        if source.name not in self._failing:
            self._failing.add(source.name)
            log.warning("replica discovery: cannot resolve %s (%s); keeping its %d replica(s)",
                        source.name, exc, sum(m.source == source for m in self.members()))

    async def _join(self, source: DnsSource, replica_id: str, address: str) -> None:
        spec = ReplicaSpec(id=replica_id, url=source.url(address), model=source.model,
                           kind="remote", block_size=source.block_size)
        try:
            await self.pool.add_replica(spec, self._make_backend(source, spec))
        except ValueError as exc:  # the id clashes with a configured replica
            log.error("replica discovery: %s not added: %s", replica_id, exc)
            return
        member = DiscoveredReplica(source, address, spec)
        self._members[replica_id] = member
        log.info("replica discovery: %s joined (%s)", replica_id, spec.url)
        for hook in self._joins:
            await hook(member)

    async def _leave(self, replica_id: str) -> None:
        member = self._members.pop(replica_id)
        log.info("replica discovery: %s left %s; draining", replica_id, member.source.name)
        for hook in self._leaves:
            await hook(replica_id)
        task = asyncio.create_task(self._drain(member), name=f"drain-{replica_id}")
        self._draining[replica_id] = task

    async def _drain(self, member: DiscoveredReplica) -> None:
        try:
            left = await self.pool.remove_replica(member.spec.id, member.source.drain_seconds)
            if left:
                log.warning("replica discovery: %s dropped with %d request(s) still in flight "
                            "after %gs", member.spec.id, left, member.source.drain_seconds)
        finally:
            with contextlib.suppress(KeyError):
                del self._draining[member.spec.id]
