"""Replica discovery from DNS with an injected resolver: joins, drains, leaves, DNS failures."""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Sequence

import httpx
import pytest
from asgi_lifespan import LifespanManager

from engine.backends.base import Timeouts
from engine.backends.httpx_client import HttpxBackend
from engine.pool.discovery import DnsDiscovery, DnsSource
from engine.pool.replicas import ReplicaPool, ReplicaSpec
from gateway import serve_cli
from gateway.config import load_settings, parse_source_arg
from gateway.server.app import create_app
from tests.support.waiting import eventually

from .fake_replica import FakeReplica

NAME = "vllm-qwen.default.svc.cluster.local"


class Dns:
    """A resolver over a dict: ``answers[name]`` is a list of addresses or an error."""

    def __init__(self, **answers: object) -> None:
        self.answers: dict[str, object] = {NAME: [], **answers}
        self.asked = 0

    async def __call__(self, host: str, port: int) -> Sequence[str]:
        self.asked += 1
        answer = self.answers.get(host, socket.gaierror(socket.EAI_NONAME, "Name not known"))
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[return-value]


class Fleet:
    """One fake replica per address; discovered backends talk to them over MockTransport."""

    def __init__(self) -> None:
        self.replicas: dict[str, FakeReplica] = {}
        self.closed: list[str] = []

    def backend(self, source: DnsSource, spec: ReplicaSpec) -> HttpxBackend:
        fake = self.replicas.setdefault(spec.id, FakeReplica(spec.id, model="qwen"))
        fleet = self

        class Closing(HttpxBackend):
            async def aclose(self) -> None:
                fleet.closed.append(spec.id)
                await super().aclose()

        return Closing(spec.id, spec.url, Timeouts(), transport=fake.transport())


@pytest.fixture
async def pool() -> AsyncIterator[ReplicaPool]:
    pool = ReplicaPool([], health_interval=3600)
    await pool.start()
    yield pool
    await pool.aclose()


def discovery(pool: ReplicaPool, dns: Dns, fleet: Fleet, **source: object) -> DnsDiscovery:
    return DnsDiscovery([DnsSource(NAME, 8000, model="qwen", **source)], pool,  # type: ignore[arg-type]
                        fleet.backend, interval=3600, resolver=dns)


def ids(pool: ReplicaPool) -> list[str]:
    return sorted(r.id for r in pool)


async def test_addresses_join_and_leave(pool: ReplicaPool) -> None:
    dns, fleet = Dns(**{NAME: ["10.0.0.5", "10.0.0.6"]}), Fleet()
    found = discovery(pool, dns, fleet)
    await found.start()
    try:
        assert ids(pool) == ["vllm-qwen-10.0.0.5", "vllm-qwen-10.0.0.6"]
        assert all(r.healthy for r in pool)  # probed once on joining
        assert pool.get("vllm-qwen-10.0.0.5").spec.url == "http://10.0.0.5:8000"
        dns.answers[NAME] = ["10.0.0.6", "10.0.0.7"]
        await found.refresh()
        await eventually(lambda: ids(pool) == ["vllm-qwen-10.0.0.6", "vllm-qwen-10.0.0.7"],
                         what="10.0.0.5 replaced by 10.0.0.7")
        await eventually(lambda: fleet.closed == ["vllm-qwen-10.0.0.5"], what="backend closed")
    finally:
        await found.aclose()


async def test_leaving_replica_finishes_in_flight_requests_first(pool: ReplicaPool) -> None:
    dns, fleet = Dns(**{NAME: ["10.0.0.5", "10.0.0.6"]}), Fleet()
    found = discovery(pool, dns, fleet, drain_seconds=60)
    await found.start()
    leaving = "vllm-qwen-10.0.0.5"
    with pool.lease(leaving) as lease:
        dns.answers[NAME] = ["10.0.0.6"]
        await found.refresh()
        await eventually(lambda: not pool.get(leaving).healthy, what="out of rotation")
        assert {v.id: v.healthy for v in pool.snapshot()} == {leaving: False,
                                                             "vllm-qwen-10.0.0.6": True}
        # draining, not failing: requests waiting on it are not moved elsewhere, and
        # the in-flight request's answer does not bring it back into rotation
        assert not pool.tripped(leaving) and pool.get(leaving).breaker.reason.value == "draining"
        pool.report_first_byte(lease, 0.01)
        assert not any(v.healthy for v in pool.snapshot() if v.id == leaving)
        # it comes back in DNS while still draining: it joins only once the drain is over
        dns.answers[NAME] = ["10.0.0.5", "10.0.0.6"]
        await found.refresh()
        assert leaving in ids(pool) and fleet.closed == []
    await eventually(lambda: leaving not in ids(pool), what="dropped once its request ended")
    await found.refresh()
    assert leaving in ids(pool) and pool.get(leaving).healthy
    await found.aclose()


async def test_drain_gives_up_after_drain_seconds(pool: ReplicaPool, caplog) -> None:
    dns, fleet = Dns(**{NAME: ["10.0.0.5"]}), Fleet()
    found = discovery(pool, dns, fleet, drain_seconds=0)
    await found.start()
    with pool.lease("vllm-qwen-10.0.0.5"), caplog.at_level(logging.WARNING):
        dns.answers[NAME] = []
        await found.refresh()
        await eventually(lambda: len(pool) == 0, what="dropped")
        await eventually(lambda: "still in flight" in caplog.text, what="warning")
    await found.aclose()


async def test_missing_name_empties_but_a_dns_failure_keeps(pool: ReplicaPool, caplog) -> None:
    dns, fleet = Dns(**{NAME: ["10.0.0.5"]}), Fleet()
    found = discovery(pool, dns, fleet)
    await found.start()
    with caplog.at_level(logging.WARNING, logger="prefixgate.discovery"):
        dns.answers[NAME] = socket.gaierror(socket.EAI_AGAIN, "Temporary failure")
        await found.refresh()
        await found.refresh()
        assert ids(pool) == ["vllm-qwen-10.0.0.5"]
        assert caplog.text.count("cannot resolve") == 1  # said once, not every round
        dns.answers[NAME] = TimeoutError("resolver timed out")
        await found.refresh()
        assert ids(pool) == ["vllm-qwen-10.0.0.5"]
    del dns.answers[NAME]  # NXDOMAIN: the Service and its pods are gone
    await found.refresh()
    await eventually(lambda: len(pool) == 0, what="all replicas left")
    await found.aclose()


async def test_hooks_hear_present_members_joins_and_leaves(pool: ReplicaPool) -> None:
    dns, fleet = Dns(**{NAME: ["10.0.0.5"]}), Fleet()
    found = discovery(pool, dns, fleet, id_prefix="q")
    await found.start()
    heard: list[str] = []

    async def joined(member) -> None:
        heard.append(f"+{member.spec.id}")

    async def left(replica_id: str) -> None:
        assert replica_id in ids(pool)  # told before the pool drops it
        heard.append(f"-{replica_id}")

    await found.watch(joined, left)
    dns.answers[NAME] = ["fd00::7"]
    await found.refresh()
    assert heard == ["+q-10.0.0.5", "-q-10.0.0.5", "+q-fd00::7"]
    assert pool.get("q-fd00::7").spec.url == "http://[fd00::7]:8000"
    await found.aclose()


async def test_an_id_clash_with_a_configured_replica_is_skipped(caplog) -> None:
    fleet = Fleet()
    static = ReplicaSpec("vllm-qwen-10.0.0.5", "http://10.0.0.5:8000")
    pool = ReplicaPool([(static, fleet.backend(DnsSource(NAME, 8000), static))],
                       health_interval=3600)
    await pool.start()
    found = discovery(pool, Dns(**{NAME: ["10.0.0.5"]}), fleet)
    await found.start()
    assert len(pool) == 1 and found.members() == []
    assert "already in the pool" in caplog.text
    await found.aclose()
    await pool.aclose()


def test_source_from_the_command_line_and_the_environment() -> None:
    args = serve_cli.build_parser().parse_args([
        "--model", "qwen", "--replicas-from",
        f"{NAME}:8000,kv_port=5557,kv_replay_port=5558,id_prefix=q"])
    settings = load_settings(overrides=serve_cli.overrides(args), env={})
    source = settings.replicas_from[0]
    assert (source.dns, source.port, source.model, source.id_prefix) == (NAME, 8000, "qwen", "q")
    assert source.kv_events is not None and (source.kv_events.port,
                                             source.kv_events.replay_port) == (5557, 5558)
    assert settings.policy_name() == "precise"  # auto: the discovered replicas publish events
    env = load_settings(env={"PREFIXGATE_REPLICAS_FROM": "a.svc:8000; b.svc:9000,scheme=https"})
    assert [(s.dns, s.port, s.scheme) for s in env.replicas_from] == [
        ("a.svc", 8000, "http"), ("b.svc", 9000, "https")]
    assert env.policy_name() == "prefix"


def test_bad_source_keys_are_named() -> None:
    from gateway.config import ConfigError
    with pytest.raises(ConfigError, match="replicas_from.0.colour: unknown key"):
        load_settings(overrides={"replicas_from": [parse_source_arg("a.svc:80,colour=red", None)]},
                      env={})
    with pytest.raises(ConfigError, match="replicas_from.0.port"):
        load_settings(overrides={"replicas_from": [parse_source_arg("a.svc:http", None)]}, env={})


async def test_gateway_routes_to_discovered_replicas() -> None:
    fakes = {f"vllm-qwen-10.0.0.{i}": FakeReplica(f"vllm-qwen-10.0.0.{i}", model="qwen")
             for i in (5, 6)}
    dns = Dns(**{NAME: ["10.0.0.5", "10.0.0.6"]})
    settings = load_settings(overrides={
        "replicas_from": [{"dns": NAME, "model": "qwen"}], "policy": "round_robin",
        "health_interval": 3600.0}, env={})
    app = create_app(settings, transport=lambda rid: fakes[rid].transport(), resolver=dns)
    chat = {"model": "qwen", "messages": [{"role": "user", "content": "hello"}]}
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            assert (await client.get("/ready")).status_code == 200
            served = [(await client.post("/v1/chat/completions", json=chat))
                      .json()["choices"][0]["message"]["content"] for _ in range(4)]
    assert sorted(served) == sorted([*fakes] * 2)


def test_a_url_given_as_a_dns_name_is_refused_with_the_flag_it_belongs_to() -> None:
    """``--replicas-from http://host:port`` resolved ``http://host`` forever, serving
    nothing; a URL is one replica's, and the error says where it goes."""
    from gateway.config import ConfigError
    with pytest.raises(ConfigError, match="not a DNS name.*--replica URL"):
        load_settings(overrides={"replicas_from": [
            parse_source_arg("http://vllm.svc:8000", None)]}, env={})


async def test_a_source_that_resolves_to_nothing_yet_is_said_and_answered_503(
        caplog: pytest.LogCaptureFixture) -> None:
    """A headless Service with no ready pod (a rollout, a cold start): start-up said
    "none of 0 answers yet", and a request for the model got 404 "does not exist. Valid
    aliases: ." (not retried by the clients) where it is a 503 to retry."""
    settings = load_settings(overrides={
        "replicas_from": [{"dns": NAME, "model": "qwen"}], "health_interval": 3600.0}, env={})
    app = create_app(settings, transport=lambda rid: FakeReplica(rid).transport(),
                     resolver=Dns())
    chat = {"model": "qwen", "messages": [{"role": "user", "content": "hello"}]}
    async with LifespanManager(app) as manager:
        transport = httpx.ASGITransport(app=manager.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
            answer = await client.post("/v1/chat/completions", json=chat)
    assert answer.status_code == 503 and answer.headers["retry-after"]
    assert f"waiting for replicas: none yet ({NAME} resolves to no address)" in caplog.text
