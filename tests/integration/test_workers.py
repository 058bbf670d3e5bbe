"""``prefixgate serve --workers 2``: two serving processes on one port, one gateway.

The real gateway process in front of four sim replicas, the official
``openai`` client as the caller, every request on a connection of its own
(so the kernel hands them to either worker): a prompt's prefix stays on one
replica whichever worker takes it, ``/metrics`` shows both workers in one
scrape, a worker killed mid-load is replaced without a failed request
elsewhere, and SIGTERM stops the whole gateway.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.api_keys import write_keys
from tests.support.gateway import GatewayProcess
from tests.support.sim import SimProcess
from tests.support.waiting import wait_until

from .conftest import MODEL, SYSTEM_REDIS, gateway_settings, running_sims, sim_args
from .test_fleet_redis import WORDS


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    """Four sims with 16-token blocks, as the fleet tests have."""
    with running_sims([sim_args(i, "--block-size", "16") for i in range(4)]) as started:
        yield started


@pytest.fixture
def gateway(sims: list[SimProcess]) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(gateway_settings(sims, policy="prefix", workers=2))
    try:
        gw.start()
        wait_until(lambda: set(worker_counts(gw)) == {"0", "1"}, 30,
                   "both workers answer the merged /metrics")
        yield gw
    finally:
        gw.stop()


def worker_counts(gw: GatewayProcess) -> Counter[str]:
    """Relayed requests answered per worker, from one scrape of the merged ``/metrics``."""
    counts: Counter[str] = Counter()
    for line in httpx.get(gw.url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("prefixgate_requests_total{") and 'replica="none"' not in line:
            labels, _, value = line.partition("} ")
            worker = labels.split('worker="')[1].split('"')[0]
            counts[worker] += int(float(value))
    return counts


def system_prompt(seed: int) -> str:
    rng = random.Random(seed)
    return f"You are assistant #{seed}. " + " ".join(rng.choice(WORDS) for _ in range(300))


async def ask(gw: GatewayProcess, system: str, question: str) -> tuple[str, int]:
    """One chat request on a fresh connection: the replica that answered, matched tokens."""
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
    try:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=4, messages=[{"role": "system", "content": system},
                                                 {"role": "user", "content": question}])
    finally:
        await client.close()
    raw.parse()
    return (raw.headers["x-prefixgate-replica"],
            int(raw.headers.get("x-prefixgate-matched-tokens", "0")))


def test_a_prefix_stays_on_one_replica_whichever_worker_takes_it(
        gateway: GatewayProcess) -> None:
    before = worker_counts(gateway)
    placed: dict[int, Counter[str]] = defaultdict(Counter)
    matched_after_first = []
    for turn in range(6):
        for seed in range(8):
            replica, matched = asyncio.run(ask(gateway, system_prompt(seed), f"question {turn}"))
            placed[seed][replica] += 1
            if turn:
                matched_after_first.append(matched)
        time.sleep(0.05)  # the first byte's lesson crosses to the other worker
    served = worker_counts(gateway) - before
    # Both workers took a share of the 48 requests: each saw prefixes the other placed.
    assert served["0"] >= 5 and served["1"] >= 5, served
    assert {seed: len(where) for seed, where in placed.items()} == dict.fromkeys(range(8), 1), \
        dict(placed)
    assert len({replica for where in placed.values() for replica in where}) > 1  # spread
    assert min(matched_after_first) > 0
    text = httpx.get(gateway.url + "/metrics", timeout=10).text
    assert 'prefixgate_workers_hub_up{worker="0"} 1.0' in text
    assert 'prefixgate_workers_hub_up{worker="1"} 1.0' in text


def test_a_client_pool_opened_at_once_spreads_over_both_workers(
        gateway: GatewayProcess) -> None:
    """One client, 16 requests at once, three times: its pool opens 16 connections
    together and keeps them. An event loop that wakes to a backlog of new connections
    would take them all; each worker takes its share instead, so both serve the
    client's traffic."""
    before = worker_counts(gateway)

    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=0)
        try:
            for turn in range(3):
                await asyncio.gather(*(client.chat.completions.create(
                    model=MODEL, max_tokens=8, messages=[
                        {"role": "system", "content": system_prompt(400 + i)},
                        {"role": "user", "content": f"turn {turn}"}]) for i in range(16)))
        finally:
            await client.close()

    asyncio.run(main())
    served = worker_counts(gateway) - before
    assert sum(served.values()) == 48
    assert min(served["0"], served["1"]) >= 21, served  # 8 connections each, give or take one


def test_after_a_worker_restarts_a_client_s_kept_connections_spread_again(
        gateway: GatewayProcess) -> None:
    """A client keeps a pool of 16 connections; one worker is killed, so its sibling
    takes every connection the pool opens again. Once the worker is back, the sibling
    closes the connections it holds over its share after their next answers, and the
    pool's new connections go to the worker that came back."""
    async def main() -> None:
        client = openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="x", max_retries=2)

        async def burst(turn: int) -> None:
            await asyncio.gather(*(client.chat.completions.create(
                model=MODEL, max_tokens=8, messages=[
                    {"role": "system", "content": system_prompt(500 + i)},
                    {"role": "user", "content": f"turn {turn}"}]) for i in range(16)))

        try:
            await burst(0)
            pids = worker_pids(gateway)
            os.kill(pids[0], signal.SIGKILL)
            await burst(1)  # the pool reconnects: every connection on the survivor
            await asyncio.to_thread(
                wait_until, lambda: len(worker_pids(gateway)) == 2
                and set(worker_counts(gateway)) == {"0", "1"}, 30, "the worker is back")
            await burst(2)  # answered with "connection: close" where the survivor holds too many
            before = await asyncio.to_thread(worker_counts, gateway)
            for turn in range(3, 7):
                await burst(turn)
            served = await asyncio.to_thread(worker_counts, gateway)
            delta = served - before
            assert sum(delta.values()) == 64
            assert min(delta["0"], delta["1"]) >= 26, delta  # 8 connections each, give or take
            text = (await asyncio.to_thread(
                httpx.get, gateway.url + "/metrics", timeout=10)).text
            held = {line.split('worker="')[1].split('"')[0]: float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("prefixgate_workers_connections{")}
            assert set(held) == {"0", "1"} and abs(held["0"] - held["1"]) <= 3, held
            shed = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                    if line.startswith("prefixgate_workers_connections_shed_total{")]
            assert sum(shed) >= 4, shed
        finally:
            await client.close()

    asyncio.run(main())


def test_one_scrape_shows_every_worker(gateway: GatewayProcess) -> None:
    for seed in range(10):
        asyncio.run(ask(gateway, system_prompt(100 + seed), "hello"))
    text = httpx.get(gateway.url + "/metrics", timeout=10).text
    loop_lag = {line.split('worker="')[1].split('"')[0] for line in text.splitlines()
                if line.startswith("prefixgate_event_loop_lag_seconds_count{")}
    assert loop_lag == {"0", "1"}
    # each family is whole (one HELP), as Prometheus requires
    assert text.count("# HELP prefixgate_requests_total ") == 1
    # The ops view, whichever worker answers it, counts both workers' requests.
    def ops_requests() -> float:
        payload = httpx.get(gateway.url + "/admin/replicas", timeout=10).json()
        return sum(replica["requests_total"] for replica in payload["replicas"])
    served = sum(worker_counts(gateway).values())
    wait_until(lambda: ops_requests() == served, 20, "the ops view counts every worker's")
    ready = httpx.get(gateway.url + "/ready", timeout=5).json()
    assert ready["ready"] is True and ready["worker"]["up"] is True
    assert ready["worker"]["peers"] == 1


def worker_pids(gw: GatewayProcess) -> list[int]:
    """The supervisor's live children (from /proc: their parent pid, not zombies)."""
    assert gw.proc is not None
    children = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as handle:
                    fields = handle.read().rpartition(")")[2].split()
            except OSError:
                continue
            if fields[0] != "Z" and int(fields[1]) == gw.proc.pid:
                children.append(int(entry))
    return children


def test_a_killed_worker_is_replaced_and_the_other_keeps_serving(
        gateway: GatewayProcess) -> None:
    placed = {seed: asyncio.run(ask(gateway, system_prompt(300 + seed), "first"))[0]
              for seed in range(6)}
    pids = worker_pids(gateway)
    assert len(pids) == 2
    os.kill(pids[0], signal.SIGKILL)
    answered = []
    for seed in range(20):  # a connection the dead worker had not accepted is not lost
        replica, _ = asyncio.run(ask(gateway, system_prompt(200 + seed), "still there?"))
        answered.append(replica)
    assert len(answered) == 20
    wait_until(lambda: len(worker_pids(gateway)) == 2 and pids[0] not in worker_pids(gateway),
               30, "the supervisor started a new worker")
    wait_until(lambda: set(worker_counts(gateway)) == {"0", "1"}, 30,
               "the new worker answers the merged /metrics")
    assert "exited with status -9: starting it again" in gateway.log()
    # The new worker started from what the others knew: the prefixes stay where they were.
    before = worker_counts(gateway)
    for turn in range(4):
        for seed, replica in placed.items():
            assert asyncio.run(ask(gateway, system_prompt(300 + seed), f"again {turn}"))[0] \
                == replica
    served = worker_counts(gateway) - before
    assert served["0"] and served["1"], served


def test_sigterm_stops_the_supervisor_and_every_worker(sims: list[SimProcess]) -> None:
    gw = GatewayProcess(gateway_settings(sims, policy="prefix", workers=2)).start()
    pids = worker_pids(gw)
    assert gw.proc is not None
    gw.proc.send_signal(signal.SIGTERM)
    assert gw.proc.wait(timeout=60) == 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_more_than_one_worker_with_client_keys_and_no_redis_is_refused(
        sims: list[SimProcess], tmp_path: Path) -> None:
    keys = tmp_path / "keys.yaml"
    write_keys(keys, [{"key": "sk-user-0001", "tenant": "alpha", "max_concurrency": 1}])
    gw = GatewayProcess(gateway_settings(sims, workers=2, api_keys=str(keys)))
    with pytest.raises(RuntimeError, match="exited 2"):
        gw.start(timeout=30)
    assert "workers: 2 needs one process here" in gw.log()
    assert "set redis_url" in gw.log()


def test_with_redis_the_workers_share_a_keys_limit(sims: list[SimProcess], tmp_path: Path,
                                                   key_prefix: str) -> None:
    keys = tmp_path / "keys.yaml"
    write_keys(keys, [{"key": "sk-user-0001", "tenant": "alpha", "requests_per_minute": 4}])
    gw = GatewayProcess(gateway_settings(sims, policy="prefix", workers=2, api_keys=str(keys),
                                         redis_url=SYSTEM_REDIS, redis_key_prefix=key_prefix))
    try:
        gw.start()
        statuses = []
        for n in range(10):  # each on a connection of its own: either worker takes it
            response = httpx.post(gw.url + "/v1/completions", timeout=30,
                                  headers={"authorization": "Bearer sk-user-0001"},
                                  json={"model": MODEL, "prompt": f"hello {n}", "max_tokens": 2})
            statuses.append(response.status_code)
            # past the limits' sync period (0.5 s, gateway.auth.shared) with room for a busy
            # machine's lag; 10 s in all stays under one refill of 4 a minute (15 s)
            time.sleep(1.0)
        # Unshared, each worker would admit 4 (8 in all). Shared, the limit holds but for
        # the documented slack: a worker that has not served the key yet starts with a
        # full bucket until its first sync (gateway.auth.shared), one request at most here.
        assert 4 <= statuses.count(200) <= 5, statuses
        assert statuses.count(429) == 10 - statuses.count(200)
        ready = httpx.get(gw.url + "/ready", timeout=5).json()
        assert ready["redis"]["up"] is True and ready["worker"]["shared_through"] == "redis"
    finally:
        gw.stop()
