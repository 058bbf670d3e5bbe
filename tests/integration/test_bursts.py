"""Bursts through the real gateway: every request of a run sent at once, as
``vllm bench serve`` does by default, to simulated replicas over real sockets.

What a user would notice: a burst of one new prefix piling onto one replica;
predictions (``x-prefixgate-matched-tokens``) far below what the replicas
served; healthy replicas taken out of rotation because a burst made them
slower; queued requests failed while the replicas were working through them.
"""

from __future__ import annotations

import asyncio
import random
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.support.gateway import GatewayProcess
from tests.support.ports import free_port
from tests.support.sim import SimProcess

from .conftest import MODEL, gateway_settings, running_sims, sim_args

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor", "whiskey"]


def text(seed: str, words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(words))


@dataclass
class Answer:
    replica: str
    matched: int
    cached: int


async def ask(client: openai.AsyncOpenAI, messages: list[ChatCompletionMessageParam],
              max_tokens: int = 8) -> Answer:
    raw = await client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=max_tokens, stream=True,
        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    cached = 0
    async for chunk in raw.parse():
        if chunk.usage is not None and chunk.usage.prompt_tokens_details is not None:
            cached = chunk.usage.prompt_tokens_details.cached_tokens or 0
    return Answer(raw.headers["x-prefixgate-replica"],
                  int(raw.headers["x-prefixgate-matched-tokens"]), cached)


def burst_of(prefix: str, size: int, question_words: int = 24
             ) -> list[list[ChatCompletionMessageParam]]:
    return [[{"role": "system", "content": prefix},
             {"role": "user", "content": text(f"{prefix[:20]}-{i}", question_words)}]
            for i in range(size)]


async def send_at_once(url: str, bursts: list[list[ChatCompletionMessageParam]],
                       max_tokens: int = 8) -> list[Answer]:
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0,
                                timeout=120)
    try:
        return list(await asyncio.gather(*(ask(client, m, max_tokens) for m in bursts)))
    finally:
        await client.close()


def breaker_openings(url: str) -> dict[str, float]:
    found = re.findall(r'^prefixgate_replica_breaker_opened_total\{replica="([^"]+)"\} (\S+)$',
                       httpx.get(url + "/metrics").text, re.MULTILINE)
    return {replica: float(value) for replica, value in found}


def per_replica(answers: list[Answer], replicas: int) -> list[int]:
    counts = Counter(a.replica for a in answers)
    return [counts.get(f"s{i}", 0) for i in range(replicas)]


def max_over_mean(counts: list[int]) -> float:
    return max(counts) / (sum(counts) / len(counts))


@pytest.fixture(scope="module")
def four_sims() -> Iterator[list[SimProcess]]:
    sims = []
    for i in range(4):
        pub, replay = free_port(), free_port()
        sim = SimProcess(sim_args(i, "--time-scale", "1", "--num-blocks", "2048",
                                  "--kv-events-port", str(pub),
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


def gateway_for(sims: list[SimProcess], policy: str, **extra: object) -> GatewayProcess:
    for sim in sims:
        assert httpx.post(sim.base_url + "/reset_prefix_cache").status_code == 200
    settings = gateway_settings(sims, policy=policy, **extra)
    for replica, sim in zip(settings["replicas"], sims):
        pub, replay = sim.kv_ports  # type: ignore[attr-defined]
        replica["kv_events"] = {"endpoint": f"tcp://127.0.0.1:{pub}",
                                "replay_endpoint": f"tcp://127.0.0.1:{replay}"}
    return GatewayProcess(settings)


JUDGING = {"breaker": {"slow": {"min_samples": 10}}}
"""The slow-replica detector judges after 10 samples a replica (instead of 20)."""


@pytest.mark.parametrize("policy", ["prefix", "precise"])
def test_bursts_spread_predict_what_the_replicas_serve_and_eject_nobody(
        four_sims: list[SimProcess], policy: str) -> None:
    gw = gateway_for(four_sims, policy, **JUDGING).start()
    try:
        shapes = [  # (system prompt words, burst size, prefixes at once)
            (512, 100, 1), (1500, 60, 1), (300, 80, 4)]
        total_matched = total_cached = 0
        for round_, (words, size, prefixes) in enumerate(shapes):
            prompts = [text(f"{policy}-{round_}-{p}", words) for p in range(prefixes)]
            burst = [m for p in prompts for m in burst_of(p, size // prefixes)]
            random.Random(round_).shuffle(burst)
            for repeat in range(2):   # a new prefix, then the same burst again
                # 48 tokens each at the simulator's real-time pace: the burst's requests
                # are on the replicas together, as a benchmark client's are
                answers = asyncio.run(send_at_once(gw.url, burst, max_tokens=48))
                counts = per_replica(answers, len(four_sims))
                assert max_over_mean(counts) <= 1.6, (words, repeat, counts)
                matched = sum(a.matched for a in answers)
                cached = sum(a.cached for a in answers)
                # each replica a prefix lands on prefills it once: while that prefill is
                # the bottleneck a burst is worth spreading over idle replicas
                assert cached > 0.7 * len(burst) * words, (words, repeat, cached)
                total_matched += matched
                total_cached += cached
        assert 0.9 <= total_matched / total_cached <= 1.1, (total_matched, total_cached)
        assert sum(breaker_openings(gw.url).values()) == 0, gw.log()
    finally:
        gw.stop()


def test_conversations_that_share_a_system_prompt_spread() -> None:
    """12 users start at once behind one system prompt; each goes on with its own history.

    Each first turn brings a document of its own (~1,500 tokens), later turns a short
    question. "At once" is what the router can tell apart: a first turn arriving while the
    system prompt is being prefilled on a replica is better off there once that replica has
    drained more of its queue than the turn's own uncached part (its own prefill, ~0.15 s
    at 10k tokens/s, the replicas' real-time pace), so that part sets how far apart the 12
    may reach the gateway (12 sent 30 ms apart still spread over all 4; with 100-token
    first turns, 15 ms apart left one replica out, as the cost model should)."""
    with running_sims([sim_args(i, "--time-scale", "1") for i in range(4)]) as sims:
        served, homes = _conversations(sims)
    counts = [served.get(f"s{i}", 0) for i in range(len(sims))]
    # Every replica takes conversations (learning a prompt as cached when sent put them
    # all on 2 of 4). Not evenly: 12 conversations are light load, under the bounded
    # load's floor of 8, and first turns arriving after the system prompt's prefill join
    # the replica holding it.
    assert min(counts) > 0 and max_over_mean(counts) <= 2.0, counts
    # later turns follow their own history
    assert sum(len(replicas) == 1 for replicas in homes.values()) >= 10, homes


def _conversations(sims: list[SimProcess]) -> tuple[Counter[str], dict[int, set[str]]]:
    gw = GatewayProcess(gateway_settings(sims, policy="prefix")).start()
    system = text("shared-system", 600)
    histories: list[list[ChatCompletionMessageParam]] = [
        [{"role": "system", "content": system}] for _ in range(12)]
    served: Counter[str] = Counter()
    homes: dict[int, set[str]] = {user: set() for user in range(12)}

    async def conversation(client: openai.AsyncOpenAI, user: int) -> None:
        for turn in range(3):
            histories[user].append({"role": "user", "content": text(f"u{user}-{turn}", 60 if turn else 900)})
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, messages=histories[user], max_tokens=16)
            replica = raw.headers["x-prefixgate-replica"]
            served[replica] += 1
            if turn:
                homes[user].add(replica)
            histories[user].append({"role": "assistant",
                                    "content": raw.parse().choices[0].message.content or ""})

    async def everyone() -> None:
        client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
        try:
            await asyncio.gather(*(conversation(client, user) for user in range(12)))
        finally:
            await client.close()

    try:
        asyncio.run(everyone())
    finally:
        gw.stop()
    return served, homes


def test_first_turns_arriving_over_a_slow_prefill_spread_at_the_configured_speed() -> None:
    """Replicas that prefill 2k tokens a second (a large model, long prompts), declared as
    such in the cost model's ``prefill_seconds_per_token``; 12 first turns behind one system
    prompt, each with ~1,000 tokens of its own, reach the gateway 80 ms apart, all within
    the first one's prefill (about a second). A turn queued behind another's prefill waits
    for it, so each is better off on a replica with less queued. The queue the gateway
    prices each replica by must drain at the declared speed: drained at the default 10k
    tokens a second, the first replica looked free after a fifth of its prefill and the
    turns went to 2 replicas, 6 each."""
    slow = ["--time-scale", "1", "--prefill-per-token", "0.0005"]
    with running_sims([sim_args(i, *slow) for i in range(4)]) as sims:
        settings = gateway_settings(sims, policy="prefix",
                                    policy_options={"prefill_seconds_per_token": 0.0005})
        gw = GatewayProcess(settings).start()
        system = text("slow-system", 600)

        async def first_turn(client: openai.AsyncOpenAI, user: int) -> str:
            await asyncio.sleep(0.08 * user)
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL, max_tokens=16, messages=[
                    {"role": "system", "content": system},
                    {"role": "user", "content": text(f"slow-u{user}", 600)}])
            return raw.headers["x-prefixgate-replica"]

        async def everyone() -> list[str]:
            client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
            try:
                return list(await asyncio.gather(*(first_turn(client, u) for u in range(12))))
            finally:
                await client.close()

        try:
            replicas = asyncio.run(everyone())
        finally:
            gw.stop()
    counts = [Counter(replicas).get(f"s{i}", 0) for i in range(len(sims))]
    assert min(counts) >= 2 and max(counts) <= 4, counts


def test_a_degraded_replica_leaves_and_the_healthy_ones_stay() -> None:
    """One replica ten times slower per token is ejected; bursts eject nobody else."""
    normal = ["--time-scale", "1", "--num-blocks", "4096"]
    degraded = [*normal, "--step-overhead", "0.05", "--prefill-per-token", "0.001",
                "--decode-per-seq", "0.002"]
    with running_sims([sim_args(0, *normal), sim_args(1, *normal), sim_args(2, *normal),
                       sim_args(3, *degraded)]) as sims:
        gw = GatewayProcess(gateway_settings(sims, policy="prefix", **JUDGING)).start()
        try:
            for round_ in range(6):
                prompt = text(f"degraded-{round_}", 400)
                answers = asyncio.run(send_at_once(gw.url, burst_of(prompt, 60)))
                assert len(answers) == 60
            openings = breaker_openings(gw.url)
            replicas = httpx.get(gw.url + "/admin/replicas").json()["replicas"]
            state = {r["id"]: r for r in replicas}
        finally:
            gw.stop()
    assert openings.get("s3", 0) >= 1, openings
    assert "slower than its peers" in (state["s3"]["last_error"] or "")
    assert all(openings.get(f"s{i}", 0) == 0 for i in range(3)), openings


def test_a_queue_longer_than_the_first_byte_timeout_is_served_not_failed() -> None:
    """Every replica saturated: requests wait in the replicas' queues past the first-byte
    timeout, as they would on vLLM directly, and all are answered."""
    busy = ["--time-scale", "1", "--max-num-seqs", "2", "--decode-per-seq", "0.01",
            "--step-overhead", "0.02"]
    with running_sims([sim_args(0, *busy), sim_args(1, *busy)]) as sims:
        settings = gateway_settings(sims, policy="prefix",
                                    timeouts={"first_byte": 1.0, "idle": 5.0})
        gw = GatewayProcess(settings).start()
        try:
            prompt = text("overload", 200)
            # 2 replicas x 2 running; 30 requests of ~64 steps (~2 s) each: the last
            # ones wait far longer than the 1 s first-byte timeout for their turn
            answers = asyncio.run(send_at_once(gw.url, burst_of(prompt, 30), max_tokens=64))
            openings = breaker_openings(gw.url)
        finally:
            gw.stop()
    assert len(answers) == 30
    assert sum(openings.values()) == 0, openings
