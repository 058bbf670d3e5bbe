"""Prefix-aware routing against simulated replicas with tight KV caches.

32 applications (system prompts) × 3 users × 3 turns through 4 sim replicas
whose caches can together hold every system prompt but one alone cannot.
The replicas' own counters (vllm:prefix_cache_hits_total / queries_total)
say how well each policy placed the requests.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion

from engine.pool.scrape import parse_vllm_metrics
from tests.support.gateway import GatewayProcess
from tests.support.ports import free_port
from tests.support.sim import SimProcess
from tests.support.waiting import wait_until

from .conftest import MODEL, gateway_settings, sim_args

APPS, USERS, TURNS = 32, 3, 3
WORDS = ["policy", "refund", "order", "shipping", "account", "invoice", "warranty", "premium", "support", "tier", "region", "latency", "model", "cache", "token", "block", "replica", "answer", "question", "customer"]


def system_prompt(app: int) -> str:
    rng = random.Random(app)
    return f"You are assistant #{app}. " + " ".join(rng.choice(WORDS) for _ in range(420))


@pytest.fixture(scope="module")
def four_sims() -> Iterator[list[SimProcess]]:
    # 4 x 480 blocks of 16 tokens: the 32 system prompts (~16k tokens) fit in the
    # aggregate cache, not in one replica's.
    sims = []
    for i in range(4):
        pub, replay = free_port(), free_port()
        sim = SimProcess(sim_args(i, "--num-blocks", "480", "--block-size", "16",
                                  "--max-model-len", "4096", "--kv-events-port", str(pub),
                                  "--kv-events-replay-port", str(replay)))
        sim.kv_ports = (pub, replay)  # type: ignore[attr-defined]
        sims.append(sim)
    try:
        for sim in sims:
            sim.start()
        yield sims
    finally:
        for sim in sims:
            sim.close()


def replica_counters(sims: list[SimProcess]) -> list[tuple[float, float]]:
    out = []
    for sim in sims:
        m = parse_vllm_metrics(httpx.get(sim.base_url + "/metrics").text)
        out.append((m.prefix_hits, m.prefix_queries))
    return out


def cached_tokens(completion: ChatCompletion) -> int:
    usage = completion.usage
    assert usage is not None and usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens is not None
    return usage.prompt_tokens_details.cached_tokens


async def drive(url: str) -> Counter[str]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    histories: dict[tuple[int, int], list[Any]] = {
        (a, u): [{"role": "system", "content": system_prompt(a)}]
        for a in range(APPS) for u in range(USERS)}
    served: Counter[str] = Counter()
    gate = asyncio.Semaphore(8)

    async def turn(key: tuple[int, int], t: int) -> None:
        history = histories[key]
        history.append({"role": "user", "content": f"user {key[1]} asks question {t}"})
        async with gate:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=history, max_tokens=8)
        served[raw.headers["x-prefixgate-replica"]] += 1
        history.append({"role": "assistant", "content": raw.parse().choices[0].message.content})

    order = list(histories)
    random.Random(7).shuffle(order)
    for t in range(TURNS):
        await asyncio.gather(*(turn(key, t) for key in order))
    await client.close()
    return served


def run_policy(sims: list[SimProcess], policy: str) -> tuple[float, Counter[str]]:
    for sim in sims:
        assert httpx.post(sim.base_url + "/reset_prefix_cache").status_code == 200
    before = replica_counters(sims)
    settings = gateway_settings(sims, policy=policy)
    for replica, sim in zip(settings["replicas"], sims):
        pub, replay = sim.kv_ports  # type: ignore[attr-defined]
        replica["kv_events"] = {"endpoint": f"tcp://127.0.0.1:{pub}",
                                "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
    gw = GatewayProcess(settings)
    try:
        gw.start()
        served = asyncio.run(drive(gw.url))
    finally:
        gw.stop()
    after = replica_counters(sims)
    hits = sum(a[0] - b[0] for a, b in zip(after, before))
    queries = sum(a[1] - b[1] for a, b in zip(after, before))
    return hits / queries, served


def test_prefix_policies_beat_round_robin_and_stay_balanced(four_sims) -> None:
    policies = ("round_robin", "prefix", "precise")
    results = {policy: run_policy(four_sims, policy) for policy in policies}
    total = APPS * USERS * TURNS
    for policy, (hit_rate, served) in results.items():
        assert sum(served.values()) == total, policy
        mean = total / len(four_sims)
        assert max(served.values()) <= 1.5 * mean, (policy, served)
    rates = {policy: round(result[0], 3) for policy, result in results.items()}
    print(f"replica-side hit rate: {rates}")
    assert rates["prefix"] > rates["round_robin"] + 0.25
    assert rates["precise"] > rates["round_robin"] + 0.25


def test_precise_learns_from_kv_events_not_only_its_own_routing(four_sims) -> None:
    """A prefix warmed on one replica behind the gateway's back is found via events."""
    for sim in four_sims:
        assert httpx.post(sim.base_url + "/reset_prefix_cache").status_code == 200
    settings = gateway_settings(four_sims, policy="precise")
    for replica, sim in zip(settings["replicas"], four_sims):
        pub, replay = sim.kv_ports
        replica["kv_events"] = {"endpoint": f"tcp://127.0.0.1:{pub}",
                                "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
    gw = GatewayProcess(settings)
    try:
        gw.start()
        messages: list[Any] = [{"role": "system", "content": system_prompt(999)},
                               {"role": "user", "content": "hello"}]
        warm = four_sims[2]  # "s2", warmed directly, not through the gateway
        direct = openai.OpenAI(base_url=warm.v1_url, api_key="x", max_retries=0)
        direct.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)

        def confirmed_blocks() -> dict[str, int]:
            replicas = httpx.get(gw.url + "/admin/replicas").json()["replicas"]
            return {r["id"]: r["indexed_blocks"] for r in replicas}

        wait_until(lambda: confirmed_blocks()["s2"] >= 20, 15,
                   "the warmed prefix's KV events in the gateway's index of s2")
        assert confirmed_blocks()["s0"] == 0

        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[*messages[:1], {"role": "user", "content": "hi"}],
            max_tokens=2)
        assert raw.headers["x-prefixgate-replica"] == "s2"
        assert int(raw.headers["x-prefixgate-matched-tokens"]) > 300
        assert cached_tokens(raw.parse()) > 300
    finally:
        gw.stop()


def test_a_long_conversation_is_routed_from_its_known_turns(four_sims) -> None:
    """Follow-ups are rendered incrementally and still predict the replica's cache."""
    for sim in four_sims:
        assert httpx.post(sim.base_url + "/reset_prefix_cache").status_code == 200
    gw = GatewayProcess(gateway_settings(four_sims, policy="prefix"))
    try:
        gw.start()
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        messages: list[Any] = [{"role": "system", "content": system_prompt(500)}]
        previous_prompt = 0
        replicas = set()
        for turn in range(8):
            messages.append({"role": "user", "content": f"question {turn}: 天気は？"})
            raw = client.chat.completions.with_raw_response.create(
                model=MODEL, messages=messages, max_tokens=8)
            completion = raw.parse()
            matched = int(raw.headers["x-prefixgate-matched-tokens"])
            cached = cached_tokens(completion)
            replicas.add(raw.headers["x-prefixgate-replica"])
            if turn:
                # the gateway knew the whole previous prompt was there, and it was
                assert matched >= (previous_prompt // 16 - 1) * 16, (turn, matched)
                assert cached >= matched, (turn, cached, matched)
            assert completion.usage is not None
            previous_prompt = completion.usage.prompt_tokens
            messages.append({"role": "assistant", "content": completion.choices[0].message.content})
        assert len(replicas) == 1
        metrics = httpx.get(gw.url + "/metrics").text
        assert f'prefixgate_incremental_render_enabled{{model="{MODEL}"}} 1.0' in metrics
        assert f'prefixgate_incremental_renders_total{{model="{MODEL}"}} 7.0' in metrics
        assert f'prefixgate_render_audit_failures_total{{model="{MODEL}"}} 0.0' in metrics
        # each follow-up's new messages have one shape: filled from its recipe, and right
        fills = re.search(rf'prefixgate_template_fills_total{{model="{MODEL}"}} (\S+)', metrics)
        assert fills is not None and float(fills.group(1)) >= 5
        assert f'prefixgate_template_fill_failures_total{{model="{MODEL}"}} 0.0' in metrics
    finally:
        gw.stop()
