"""The simulated replica's /metrics: vLLM's series move as requests are served."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from tests.support.sim import SimProcess, running_sim
from tests.support.waiting import wait_until

LABELS = {"model_name": "sim-m", "engine": "0"}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with running_sim(
        "--time-scale", "50", "--served-model-name", "sim-m", "--num-blocks", "1024"
    ) as process:
        yield process


def scrape(sim: SimProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = httpx.get(f"{sim.base_url}/metrics").text
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **extra: str
) -> float:
    return samples[(name, tuple(sorted({**LABELS, **extra}.items())))]


def test_vllm_series_exist_with_vllm_labels(sim: SimProcess) -> None:
    samples = scrape(sim)
    names = {name for name, _ in samples}
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:request_success_total",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:time_per_output_token_seconds_bucket",
        "vllm:inter_token_latency_seconds_bucket",
        "vllm:e2e_request_latency_seconds_bucket",
        "vllm:request_queue_time_seconds_bucket",
        "vllm:cache_config_info",
    ):
        assert name in names, name
    info = next(labels for name, labels in samples if name == "vllm:cache_config_info")
    info_labels = dict(info)
    assert info_labels["block_size"] == "16" and info_labels["num_gpu_blocks"] == "1024"
    assert info_labels["enable_prefix_caching"] == "True" and info_labels["cache_dtype"] == "auto"
    assert "gpu_memory_utilization" in info_labels


def test_counters_move_with_traffic(sim: SimProcess) -> None:
    before = scrape(sim)
    prompt: list[ChatCompletionMessageParam] = [{"role": "user", "content": "metrics " * 200}]
    with openai.OpenAI(base_url=sim.v1_url, api_key="unused", max_retries=0) as client:
        for _ in range(2):
            client.chat.completions.create(
                model="sim-m",
                messages=prompt,
                max_tokens=4,
                extra_body={"ignore_eos": True},
            )
    after = scrape(sim)

    def delta(name: str, **extra: str) -> float:
        return value(after, name, **extra) - value(before, name, **extra)

    assert delta("vllm:request_success_total", finished_reason="length") == 2
    assert delta("vllm:generation_tokens_total") == 8
    assert delta("vllm:prompt_tokens_total") > 1600
    assert delta("vllm:prefix_cache_queries_total") == delta("vllm:prompt_tokens_total")
    assert delta("vllm:prefix_cache_hits_total") >= 1584  # the second request hit its prompt
    assert delta("vllm:time_to_first_token_seconds_count") == 2
    assert delta("vllm:e2e_request_latency_seconds_count") == 2
    assert value(after, "vllm:num_requests_running") == 0
    assert 0.0 <= value(after, "vllm:kv_cache_usage_perc") <= 1.0


def test_a_client_that_disconnects_aborts_its_request(sim: SimProcess) -> None:
    body = {
        "model": "sim-m",
        "messages": [{"role": "user", "content": "abort me"}],
        "max_tokens": 2000,
        "ignore_eos": True,
        "stream": True,
    }
    before = value(scrape(sim), "vllm:request_success_total", finished_reason="abort")
    with httpx.stream("POST", f"{sim.v1_url}/chat/completions", json=body) as response:
        data_lines = 0
        for line in response.iter_lines():
            data_lines += line.startswith("data: ")
            if data_lines == 2:
                break  # the role chunk and one generated token arrived; now hang up
    # the abort happens in the server after the socket closes
    wait_until(lambda: value(scrape(sim), "vllm:request_success_total",
                             finished_reason="abort") == before + 1, 10, "the abort counted")
    samples = scrape(sim)
    assert value(samples, "vllm:num_requests_running") == 0
