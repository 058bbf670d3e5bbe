"""The ops view tells the truth: gateway metrics and /admin/replicas against the replicas.

Two simulated replicas behind the gateway (``prefix`` policy). A known
workload — a few long system prompts, each sent several times with a new
question — is streamed through it, one request at a time. The test keeps its
own books from what a client sees (``x-prefixgate-replica``,
``x-prefixgate-matched-tokens``, ``usage``) and from the replicas' own
``/metrics``, then checks that the gateway's Prometheus series and
``/admin/replicas`` say the same, per replica.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.pool.scrape import parse_vllm_metrics
from tests.support.gateway import GatewayProcess
from tests.support.sim import SimProcess
from tests.support.waiting import wait_until

from .conftest import MODEL, gateway_settings, sim_args

PROMPTS, REPEATS = 4, 5
WORDS = ["refund", "order", "invoice", "warranty", "account", "premium", "region", "cache", "block", "replica"]


def system_prompt(app: int) -> str:
    rng = random.Random(app)
    return f"You are assistant #{app}. " + " ".join(rng.choice(WORDS) for _ in range(300))


@dataclass
class Books:
    """What the client saw, per replica."""

    requests: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    prompt_tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    matched_tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    cached_tokens: dict[str, int] = field(default_factory=lambda: defaultdict(int))


@pytest.fixture(scope="module")
def sims() -> Iterator[list[SimProcess]]:
    procs = [SimProcess(sim_args(i)) for i in range(2)]
    try:
        for proc in procs:
            proc.start()
        yield procs
    finally:
        for proc in procs:
            proc.close()


@pytest.fixture(scope="module")
def gateway(sims: list[SimProcess]) -> Iterator[GatewayProcess]:
    gw = GatewayProcess(gateway_settings(sims, policy="prefix"))
    try:
        yield gw.start()
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def books(gateway: GatewayProcess) -> Books:
    seen = Books()
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        for turn in range(REPEATS):
            for app in range(PROMPTS):
                body = {"model": MODEL, "stream": True, "max_tokens": 8,
                        "stream_options": {"include_usage": True},
                        "messages": [{"role": "system", "content": system_prompt(app)},
                                     {"role": "user", "content": f"question {turn} for {app}"}]}
                with client.stream("POST", "/v1/chat/completions", json=body) as response:
                    assert response.status_code == 200
                    usage = stream_usage(response.iter_lines())
                replica = response.headers["x-prefixgate-replica"]
                seen.requests[replica] += 1
                seen.matched_tokens[replica] += int(response.headers["x-prefixgate-matched-tokens"])
                seen.prompt_tokens[replica] += usage["prompt_tokens"]
                seen.cached_tokens[replica] += usage["prompt_tokens_details"]["cached_tokens"]
    return seen


def stream_usage(lines: Iterator[str]) -> dict:
    usage = None
    for line in lines:
        if line.startswith("data: {"):
            chunk = json.loads(line[len("data: "):])
            usage = chunk.get("usage") or usage
    assert usage is not None, "the stream carried no usage"
    return usage


def gateway_samples(gateway: GatewayProcess) -> dict[tuple[str, str], float]:
    """``(sample name, replica) -> value`` from the gateway's /metrics."""
    text = httpx.get(gateway.url + "/metrics").text
    return {(s.name, s.labels.get("replica", s.labels.get("model", ""))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples
            if "le" not in s.labels}


def replica_counters(sims: list[SimProcess]) -> dict[str, tuple[float, float, float]]:
    out = {}
    for i, sim in enumerate(sims):
        m = parse_vllm_metrics(httpx.get(sim.base_url + "/metrics").text)
        assert m.ttft is not None
        out[f"s{i}"] = (m.prefix_hits, m.prefix_queries, m.ttft.count)
    return out


def caught_up(gateway: GatewayProcess, sims: list[SimProcess]) -> bool:
    samples = gateway_samples(gateway)
    return all(
        samples.get(("prefixgate_replica_prefix_cache_hits_tokens_total", rid)) == hits
        and samples.get(("prefixgate_replica_prefix_cache_queries_tokens_total", rid)) == queries
        for rid, (hits, queries, _) in replica_counters(sims).items())


def test_predicted_hit_rate_series_match_what_clients_were_told(
        gateway: GatewayProcess, books: Books) -> None:
    samples = gateway_samples(gateway)
    assert sum(books.requests.values()) == PROMPTS * REPEATS
    for replica, count in books.requests.items():
        assert samples[("prefixgate_requests_total", replica)] == count
        assert samples[("prefixgate_prompt_tokens_total", replica)] == books.prompt_tokens[replica]
        assert (samples[("prefixgate_predicted_cached_tokens_total", replica)]
                == books.matched_tokens[replica])
        assert (samples[("prefixgate_usage_cached_tokens_total", replica)]
                == books.cached_tokens[replica])
        assert samples[("prefixgate_time_to_first_token_seconds_count", replica)] == count


def test_actual_hit_rate_series_are_the_replicas_own_counters(
        gateway: GatewayProcess, sims: list[SimProcess], books: Books) -> None:
    wait_until(lambda: caught_up(gateway, sims), 15, "the gateway's scrape of the replicas")
    samples = gateway_samples(gateway)
    for replica, (hits, queries, ttft_count) in replica_counters(sims).items():
        assert samples[("prefixgate_replica_prefix_cache_hits_tokens_total", replica)] == hits
        assert samples[("prefixgate_replica_prefix_cache_queries_tokens_total", replica)] == queries
        assert (samples[("prefixgate_replica_time_to_first_token_seconds_count", replica)]
                == ttft_count)
        # Every request went through the gateway, so the replica's hits are the
        # cached tokens it reported to the clients.
        assert hits == books.cached_tokens.get(replica, 0)
    assert samples[("prefixgate_healthy_replicas", MODEL)] == 2
    # The repeated system prompts were hits, and the gateway knew where they were.
    predicted = sum(books.matched_tokens.values()) / sum(books.prompt_tokens.values())
    actual = sum(books.cached_tokens.values()) / sum(books.prompt_tokens.values())
    assert actual > 0.5
    assert predicted == pytest.approx(actual, abs=0.02)


def test_admin_replicas_agrees_with_the_books(
        gateway: GatewayProcess, sims: list[SimProcess], books: Books) -> None:
    wait_until(lambda: caught_up(gateway, sims), 15, "the gateway's scrape of the replicas")
    data = httpx.get(gateway.url + "/admin/replicas").json()
    counters = replica_counters(sims)
    assert data["policy"] == "prefix"
    assert {r["id"] for r in data["replicas"]} == {"s0", "s1"}
    for r in data["replicas"]:
        rid = r["id"]
        hits, queries, _ = counters[rid]
        assert r["healthy"] is True and r["model"] == MODEL and r["url"] == sims[int(rid[1])].base_url
        assert r["requests_total"] == books.requests.get(rid, 0)
        assert r["prompt_tokens_total"] == books.prompt_tokens.get(rid, 0)
        assert r["predicted_cached_tokens_total"] == books.matched_tokens.get(rid, 0)
        assert r["cache_hits_tokens_total"] == hits
        assert r["cache_queries_tokens_total"] == queries
        if books.requests.get(rid):
            expected_predicted = books.matched_tokens[rid] / books.prompt_tokens[rid]
            assert r["predicted_hit_rate_total"] == pytest.approx(expected_predicted, abs=1e-4)
            assert r["actual_hit_rate_total"] == pytest.approx(hits / queries, abs=1e-4)
            # The test is younger than the one-minute window: both spans agree.
            assert r["predicted_hit_rate_1m"] == r["predicted_hit_rate_total"]
            assert r["actual_hit_rate_1m"] == r["actual_hit_rate_total"]
            assert r["ttft_samples_1m"] == books.requests[rid]
            assert 0 < r["ttft_p50_1m_s"] <= r["ttft_p99_1m_s"]
            assert r["indexed_blocks"] > 0
        assert r["block_size"] == 16 and r["capacity_blocks"] > 0
        assert len(r["history"]["age_s"]) >= 1


def test_a_stopped_replica_shows_as_down(gateway: GatewayProcess,
                                         sims: list[SimProcess], books: Books) -> None:
    sims[1].stop()
    wait_until(lambda: gateway_samples(gateway).get(("prefixgate_healthy_replicas", MODEL)) == 1,
               15, "one healthy replica in the gateway's metrics")
    data = httpx.get(gateway.url + "/admin/replicas").json()
    down = next(r for r in data["replicas"] if r["id"] == "s1")
    assert down["healthy"] is False and down["last_error"]
    assert data["replicas_healthy"] == 1
    assert gateway_samples(gateway)[("prefixgate_replica_healthy", "s1")] == 0
