"""Reading a vLLM replica's /metrics text."""

from __future__ import annotations

from engine.scrape import parse_vllm_metrics

VLLM_TEXT = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_running{engine="1",model_name="qwen"} 2.0
vllm:num_requests_waiting{engine="0",model_name="qwen"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="qwen"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="qwen"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="qwen"} 640.0
vllm:cache_config_info{block_size="32",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_gpu_blocks="2048"} 1.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="qwen"} 0.0
"""


def test_reads_the_series_routing_needs() -> None:
    m = parse_vllm_metrics(VLLM_TEXT)
    assert (m.running, m.waiting) == (5, 4)
    assert m.kv_usage == 0.375
    assert (m.prefix_queries, m.prefix_hits) == (1000.0, 640.0)
    assert (m.block_size, m.num_gpu_blocks) == (32, 2048)
    assert m.model_names == ("qwen",)


def test_accepts_the_older_gpu_cache_name() -> None:
    m = parse_vllm_metrics('vllm:gpu_cache_usage_perc{model_name="x"} 0.9\n')
    assert m.kv_usage == 0.9


def test_garbage_is_ignored() -> None:
    m = parse_vllm_metrics("vllm:num_requests_running{broken 1\nvllm:num_requests_waiting NaN\n\n")
    assert (m.running, m.waiting) == (0, 0)
