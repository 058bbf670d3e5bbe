"""Replica discovery behind the real gateway process: a DNS name resolving to loopback.

``--replicas-from localhost:PORT`` (the command-line form) in front of a sim
replica on ``127.0.0.1:PORT`` that publishes KV events: the gateway must find
the replica through the system resolver, follow its KV events at the
discovered address (the replay buffer it warmed before the gateway started is
indexed), and route the official client's request there as a hit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import openai
import pytest
from asgi_lifespan import LifespanManager

from engine.tokenizer import bundled_qwen_tokenizer_dir
from gateway.config import load_settings
from gateway.server.app import create_app
from tests.support.gateway import GatewayProcess
from tests.support.ports import free_port
from tests.support.sim import SimProcess
from tests.support.waiting import eventually, wait_until

from .conftest import MODEL, sim_args, started
from .test_precise_warm_start import replay_buffer

SYSTEM = "You are the discovered assistant. " + "Answer from the cached handbook. " * 80
REPLICA = "localhost-127.0.0.1"
NAME = "vllm-sim.test.svc.cluster.local"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    pub, replay = free_port(), free_port()
    sim = SimProcess(sim_args(0, "--block-size", "16", "--kv-events-port", str(pub),
                              "--kv-events-replay-port", str(replay)))
    sim.kv_ports = (pub, replay)  # type: ignore[attr-defined]
    with sim.start():
        yield sim


def test_replicas_from_a_name_that_resolves_to_loopback(sim: SimProcess) -> None:
    direct = openai.OpenAI(base_url=sim.v1_url, api_key="x", max_retries=0)
    direct.chat.completions.create(
        model=MODEL, max_tokens=2,
        messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hello"}])
    wait_until(lambda: replay_buffer(sim)[0] >= 1, what="the prompt in the replay buffer")
    stored = replay_buffer(sim)[1]

    pub, replay = sim.kv_ports  # type: ignore[attr-defined]
    settings = {"health_interval": 0.2,
                "models": [{"name": MODEL, "tokenizer": bundled_qwen_tokenizer_dir()}]}
    source = f"localhost:{sim.port},kv_port={pub},kv_replay_port={replay}"
    gw = GatewayProcess(settings, ["--replicas-from", source, "--model", MODEL])
    try:
        gw.start()

        def replicas() -> dict[str, dict]:
            body = httpx.get(gw.url + "/admin/replicas").json()
            return {r["id"]: r for r in body["replicas"]}

        found = replicas()
        assert found[REPLICA]["healthy"] and found[REPLICA]["url"] == sim.base_url
        assert "policy precise" in gw.log()  # auto: the discovered replica publishes events
        wait_until(lambda: replicas()[REPLICA]["indexed_blocks"] == stored,
                   what="the discovered replica's cached blocks learnt from its KV events")

        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=2,
            messages=[{"role": "system", "content": SYSTEM}, {"role": "user", "content": "hi"}])
        assert raw.headers["x-prefixgate-replica"] == REPLICA
        assert int(raw.headers["x-prefixgate-matched-tokens"]) > 300
        usage = raw.parse().usage
        assert usage is not None and usage.prompt_tokens_details is not None
        assert (usage.prompt_tokens_details.cached_tokens or 0) > 300
    finally:
        gw.stop()


@pytest.fixture
def loopback_sims() -> Iterator[list[SimProcess]]:
    """Two slow sims on one port, at 127.0.0.2 and 127.0.0.3 (Linux's loopback is a /8)."""
    port = free_port()
    slow = ["--step-overhead", "0.05", "--time-scale", "1", "--output-len-min", "60",
            "--output-len-max", "60"]
    with started([SimProcess(sim_args(i, *slow), port=port, host=f"127.0.0.{i + 2}")
                  for i in (0, 1)]) as sims:
        yield sims


async def test_a_leaving_replica_finishes_its_stream_then_leaves(
        loopback_sims: list[SimProcess]) -> None:
    """The name's answer changes under a running request: the request completes on the
    leaving replica, new ones go to the other, and the replica is dropped once idle."""
    answers = {NAME: ["127.0.0.2", "127.0.0.3"]}

    async def resolver(host: str, port: int) -> list[str]:
        return list(answers[host])

    port = loopback_sims[0].port
    settings = load_settings(overrides={
        "replicas_from": [{"dns": NAME, "port": port, "model": MODEL, "id_prefix": "sim"}],
        "policy": "least_load", "health_interval": 0.2,  # also the re-resolve period
        "models": [{"name": MODEL, "tokenizer": bundled_qwen_tokenizer_dir()}]}, env={})
    app = create_app(settings, resolver=resolver)
    async with LifespanManager(app, startup_timeout=60, shutdown_timeout=30) as manager, \
            httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://gw") as http:
        state = app.gateway
        pool = state.pool
        assert sorted(r.id for r in pool) == ["sim-127.0.0.2", "sim-127.0.0.3"]
        # openai annotates httpx2's client only, yet takes httpx's too (it checks for both)
        client = openai.AsyncOpenAI(base_url="http://gw/v1", api_key="x", max_retries=0,
                                    http_client=http)  # type: ignore[arg-type]

        async def ask() -> tuple[str, str]:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, max_tokens=60, messages=[{"role": "user", "content": "count"}])
            return raw.headers["x-prefixgate-replica"], raw.parse().choices[0].finish_reason

        running = asyncio.create_task(ask())
        await eventually(lambda: sum(r.inflight for r in pool) == 1, what="request in flight")
        leaving = next(r.id for r in pool if r.inflight)
        staying = next(r.id for r in pool if not r.inflight)
        answers[NAME] = [staying.removeprefix("sim-")]
        await eventually(lambda: not any(r.healthy for r in pool if r.id == leaving),
                         what="the leaving replica out of rotation")
        assert leaving in [r.id for r in pool] and not running.done()
        assert (await ask())[0] == staying  # new requests go elsewhere at once
        assert await running == (leaving, "stop")  # the running one completes in full
        await eventually(lambda: leaving not in [r.id for r in pool], what="dropped when idle")
