"""Prefix-aware routing against simulated replicas with tight KV caches.

32 applications (system prompts) × 3 users × 3 turns through 4 sim replicas
whose caches can together hold every system prompt but one alone cannot.
The replicas' own counters (vllm:prefix_cache_hits_total / queries_total)
say how well each policy placed the requests.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Iterator

import httpx
import openai
import pytest

from engine.scrape import parse_vllm_metrics
from tests.support.gateway import GatewayProcess
from tests.support.sim import SimProcess

from .conftest import MODEL, gateway_settings, sim_args

APPS, USERS, TURNS = 32, 3, 3
WORDS = ("policy refund order shipping account invoice warranty premium support tier "
         "region latency model cache token block replica answer question customer").split()


def system_prompt(app: int) -> str:
    rng = random.Random(app)
    return f"You are assistant #{app}. " + " ".join(rng.choice(WORDS) for _ in range(420))


@pytest.fixture(scope="module")
def four_sims() -> Iterator[list[SimProcess]]:
    # 4 x 480 blocks of 16 tokens: the 32 system prompts (~16k tokens) fit in the
    # aggregate cache, not in one replica's.
    sims = [SimProcess(sim_args(i, "--num-blocks", "480", "--block-size", "16",
                                  "--max-model-len", "4096"))
            for i in range(4)]
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


async def drive(url: str) -> Counter[str]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    histories = {(a, u): [{"role": "system", "content": system_prompt(a)}]
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
    gw = GatewayProcess(gateway_settings(sims, policy=policy))
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
    results = {policy: run_policy(four_sims, policy) for policy in ("round_robin", "prefix")}
    total = APPS * USERS * TURNS
    for policy, (hit_rate, served) in results.items():
        assert sum(served.values()) == total, policy
        mean = total / len(four_sims)
        assert max(served.values()) <= 1.5 * mean, (policy, served)
    rr, prefix = results["round_robin"][0], results["prefix"][0]
    print(f"replica-side hit rate: round_robin {rr:.3f}, prefix {prefix:.3f}")
    assert prefix > rr + 0.25
