"""Several gateway processes sharing routing state through the real Redis.

Two (or three) gateway processes in front of the same four sim replicas, the
official ``openai`` client as the caller: what one instance learns, the
other routes by; a restarted instance starts from the shared snapshot; a
Redis that dies mid-load costs no request and sharing resumes when it is
back. Each test has its own key prefix on the system Redis (127.0.0.1:6379),
or a ``redis-server`` of its own for the fault test.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import openai
import pytest
import redis

from gateway.fleet.codec import decode_snapshot
from tests.support.gateway import GatewayProcess
from tests.support.ports import free_port
from tests.support.sim import SimProcess
from tests.support.waiting import eventually, wait_until

from .conftest import MODEL, SYSTEM_REDIS, gateway_settings, running_sims, sim_args

WORDS = ["refund", "order", "shipping", "invoice", "warranty", "region", "cache", "token",
         "replica", "answer", "customer", "premium", "latency", "support"]


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    with running_sims([sim_args(i, "--block-size", "16") for i in range(4)]) as started:
        yield started


def instance(sims: list[SimProcess], redis_url: str, key_prefix: str) -> GatewayProcess:
    return GatewayProcess(gateway_settings(sims, policy="prefix", redis_url=redis_url,
                                           redis_key_prefix=key_prefix))


@contextlib.contextmanager
def instances(count: int, sims: list[SimProcess], redis_url: str,
              key_prefix: str) -> Iterator[list[GatewayProcess]]:
    started: list[GatewayProcess] = []
    try:
        for _ in range(count):
            started.append(instance(sims, redis_url, key_prefix).start())
        yield started
    finally:
        for gw in started:
            gw.stop()


def gauge(gw: GatewayProcess, name: str) -> float:
    """A sample of the gateway's ``/metrics`` without labels (``name`` or ``name_total``)."""
    for line in httpx.get(gw.url + "/metrics", timeout=5).text.splitlines():
        series, _, value = line.partition(" ")
        if series in (name, name + "_total"):
            return float(value)
    raise AssertionError(f"{name} not in {gw.url}/metrics")


def redis_up_is(gw: GatewayProcess, value: int) -> Callable[[], bool]:
    """A check that ``gw`` reports ``prefixgate_redis_up`` as ``value``."""
    return lambda: gauge(gw, "prefixgate_redis_up") == value


class Conversation:
    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        system = f"You are assistant #{seed}. " + " ".join(rng.choice(WORDS) for _ in range(300))
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
        self.turns = 0

    async def turn(self, gw: GatewayProcess) -> tuple[str, int]:
        """One turn through ``gw``: the replica that answered and the matched tokens."""
        self.turns += 1
        self.messages.append({"role": "user", "content": f"question {self.turns}, please"})
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        try:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=self.messages, max_tokens=8)  # type: ignore[arg-type]
        finally:
            await client.close()
        answer = raw.parse().choices[0].message.content
        self.messages.append({"role": "assistant", "content": answer})
        return (raw.headers["x-prefixgate-replica"],
                int(raw.headers.get("x-prefixgate-matched-tokens", "0")))


def first_turns(conversations: list[Conversation], gw: GatewayProcess) -> list[str]:
    return [asyncio.run(c.turn(gw))[0] for c in conversations]


def test_turn_two_through_another_instance_finds_turn_ones_replica(
        sims: list[SimProcess], key_prefix: str) -> None:
    with instances(2, sims, SYSTEM_REDIS, key_prefix) as (a, b):
        conversations = [Conversation(seed) for seed in range(6)]
        placed = first_turns(conversations, a)
        assert len(set(placed)) > 1, placed  # spread: the test is not one replica's luck
        wait_until(lambda: gauge(b, "prefixgate_redis_applied_entries") >= len(conversations),
                   30, "instance B learned instance A's requests")
        for conversation, replica in zip(conversations, placed):
            served, matched = asyncio.run(conversation.turn(b))
            assert served == replica
            assert matched > 0
        assert gauge(a, "prefixgate_redis_up") == 1 and gauge(b, "prefixgate_redis_up") == 1
        assert gauge(a, "prefixgate_redis_peers") == 1


def test_a_restarted_instance_starts_from_the_shared_snapshot(
        sims: list[SimProcess], key_prefix: str) -> None:
    store = redis.Redis.from_url(SYSTEM_REDIS)
    conversations = [Conversation(seed) for seed in range(100, 105)]
    gw = instance(sims, SYSTEM_REDIS, key_prefix).start()
    try:
        placed = first_turns(conversations, gw)
        done = time.time()

        def snapshot_covers_them() -> bool:
            raw = store.get(key_prefix + "snapshot")
            # bytes: the client does not decode what it reads
            return isinstance(raw, bytes) and decode_snapshot(raw).written_at > done

        wait_until(snapshot_covers_them, 30, "a snapshot written after the first turns")
    finally:
        gw.stop()
    # Only the snapshot is left to learn from: the stream is emptied.
    store.xtrim(key_prefix + "stream", maxlen=0)
    store.close()
    restarted = instance(sims, SYSTEM_REDIS, key_prefix).start()
    try:
        for conversation, replica in zip(conversations, placed):
            served, matched = asyncio.run(conversation.turn(restarted))
            assert served == replica
            assert matched > 0
    finally:
        restarted.stop()


class RedisServer:
    """A ``redis-server`` of the test's own, killed and restarted on the same port."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        wait_until(lambda: _pings(client), 20, "redis-server up")
        client.close()
        return self

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


async def load(gateways: list[GatewayProcess], conversations: list[Conversation],
               rounds: int, answered: list[str] | None = None) -> list[BaseException]:
    """Every conversation takes ``rounds`` turns, alternating instances; the failures
    (``answered`` gets the replica of each turn as it is answered)."""
    failures: list[BaseException] = []
    answered = [] if answered is None else answered

    async def converse(index: int, conversation: Conversation) -> None:
        for turn in range(rounds):
            try:
                replica, _ = await conversation.turn(gateways[(index + turn) % len(gateways)])
                answered.append(replica)
            except (openai.OpenAIError, KeyError) as exc:
                failures.append(exc)

    await asyncio.gather(*(converse(i, c) for i, c in enumerate(conversations)))
    return failures


async def load_killing(server: RedisServer, gateways: list[GatewayProcess],
                       conversations: list[Conversation],
                       rounds: int) -> tuple[list[BaseException], int]:
    """:func:`load`, with the Redis server killed once a quarter of the turns are
    answered; the failures and the turns answered after the kill."""
    answered: list[str] = []
    running = asyncio.ensure_future(load(gateways, conversations, rounds, answered))
    await eventually(lambda: len(answered) >= len(conversations) * rounds // 4 or running.done(),
                     60, "a quarter of the turns answered")
    server.kill()
    at_kill = len(answered)
    failures = await running
    return failures, len(answered) - at_kill


def test_redis_dying_mid_load_fails_no_request_and_sharing_resumes(
        sims: list[SimProcess]) -> None:
    server = RedisServer().start()
    try:
        with instances(2, sims, server.url, "prefixgate-fault:") as (a, b):
            conversations = [Conversation(seed) for seed in range(200, 208)]
            failures, after_kill = asyncio.run(load_killing(server, [a, b], conversations, 5))
            for gw in (a, b):
                wait_until(redis_up_is(gw, 0), 30,
                           "prefixgate_redis_up 0 without Redis")
                ready = httpx.get(gw.url + "/ready", timeout=5)
                assert ready.status_code == 200  # Redis is optional: still ready
                assert ready.json()["redis"]["up"] is False
                assert "redis" in ready.json()["redis"]["url"]
                view = httpx.get(gw.url + "/admin/replicas", timeout=5).json()
                assert view["redis"]["up"] is False  # the dashboard says so too
            assert failures == [] and after_kill >= len(conversations)
            server.start()
            for gw in (a, b):
                wait_until(redis_up_is(gw, 1), 60,
                           "prefixgate_redis_up 1 once Redis is back")
                assert httpx.get(gw.url + "/ready", timeout=5).json()["redis"]["up"] is True
            applied = gauge(b, "prefixgate_redis_applied_entries")
            fresh = [Conversation(seed) for seed in range(300, 304)]
            placed = first_turns(fresh, a)
            wait_until(lambda: gauge(b, "prefixgate_redis_applied_entries")
                       >= applied + len(fresh), 30, "B learns from A again")
            for conversation, replica in zip(fresh, placed):
                served, matched = asyncio.run(conversation.turn(b))
                assert served == replica and matched > 0
            for gw in (a, b):  # one line on the loss, one on the recovery
                log = gw.log()
                assert log.count("unreachable") == 1, log
                assert log.count("resynchronised") == 1, log
    finally:
        server.kill()


def test_an_instance_starting_without_its_redis_serves_and_joins_when_it_appears(
        sims: list[SimProcess]) -> None:
    server = RedisServer()  # its port is free: nothing listens yet
    try:
        with instances(1, sims, server.url, "prefixgate-late:") as (gw,):
            assert asyncio.run(Conversation(400).turn(gw))[0]
            assert gauge(gw, "prefixgate_redis_up") == 0
            server.start()
            wait_until(lambda: gauge(gw, "prefixgate_redis_up") == 1, 60,
                       "prefixgate_redis_up 1 once Redis is there")
            client = redis.Redis(port=server.port)
            wait_until(lambda: client.exists("prefixgate-late:stream") == 1, 30,
                       "the instance publishes to it")
            client.close()
            log = gw.log()
            assert log.count("unreachable") == 1, log
    finally:
        server.kill()
