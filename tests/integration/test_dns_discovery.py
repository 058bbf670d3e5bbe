"""Replica discovery behind the real gateway process: a DNS name resolving to loopback.

``--replicas-from localhost:PORT`` (the command-line form) in front of a sim
replica on ``127.0.0.1:PORT`` that publishes KV events: the gateway must find
the replica through the system resolver, follow its KV events at the
discovered address (the replay buffer it warmed before the gateway started is
indexed), and route the official client's request there as a hit.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from engine.tokenizer import bundled_qwen_tokenizer_dir
from tests.support.gateway import GatewayProcess
from tests.support.ports import free_port
from tests.support.sim import SimProcess
from tests.support.waiting import wait_until

from .conftest import MODEL, sim_args
from .test_precise_warm_start import replay_buffer

SYSTEM = "You are the discovered assistant. " + "Answer from the cached handbook. " * 80
REPLICA = "localhost-127.0.0.1"


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
