"""Reading a vLLM replica's /metrics text."""

from __future__ import annotations

from engine.pool.scrape import parse_vllm_metrics

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
    assert m.kv_cache_dtype == "auto"
    assert m.model_names == ("qwen",)


def test_accepts_the_older_gpu_cache_name() -> None:
    m = parse_vllm_metrics('vllm:gpu_cache_usage_perc{model_name="x"} 0.9\n')
    assert m.kv_usage == 0.9


def test_garbage_is_ignored() -> None:
    m = parse_vllm_metrics("vllm:num_requests_running{broken 1\nvllm:num_requests_waiting NaN\n\n")
    assert (m.running, m.waiting) == (0, 0)


def test_keeps_the_replicas_latency_histograms_summed_over_engines() -> None:
    lines = []
    for engine, counts in (("0", (1, 3, 4)), ("1", (0, 2, 2))):
        for le, count in zip(("0.1", "1.0", "+Inf"), counts):
            lines.append(f'vllm:time_to_first_token_seconds_bucket{{engine="{engine}",'
                         f'le="{le}",model_name="q"}} {count}.0')
        lines.append(f'vllm:time_to_first_token_seconds_sum{{engine="{engine}",model_name="q"}} 2.5')
        lines.append(f'vllm:time_to_first_token_seconds_count{{engine="{engine}",model_name="q"}} '
                     f'{counts[-1]}.0')
    lines.append('vllm:time_per_output_token_seconds_bucket{le="+Inf"} 7.0')
    lines.append('vllm:time_per_output_token_seconds_count 7.0')
    m = parse_vllm_metrics("\n".join(lines) + "\n")
    assert m.ttft is not None
    assert m.ttft.buckets == ((0.1, 1.0), (1.0, 5.0), (float("inf"), 6.0))
    assert (m.ttft.sum, m.ttft.count) == (5.0, 6.0)
    # Older vLLM names the inter-token histogram time_per_output_token.
    assert m.itl is not None and m.itl.count == 7.0


def test_a_histogram_without_its_inf_bucket_is_dropped() -> None:
    m = parse_vllm_metrics(VLLM_TEXT)
    assert m.ttft is None and m.itl is None


def test_reads_real_vllm_text_whatever_its_line_endings_and_order() -> None:
    # A real vLLM 0.32 /metrics (tests/fixtures/vllm): the same figures from it as from
    # its lines reversed, with CRLF endings, and with no final newline; a series whose
    # name only starts like a read one is not read.
    from pathlib import Path

    text = (Path(__file__).parents[1] / "fixtures" / "vllm" / "metrics.txt").read_text()
    expected = parse_vllm_metrics(text)
    assert expected.prefix_queries > 0 and expected.ttft is not None
    assert expected.block_size == 32 and expected.model_names
    reversed_lines = "\n".join(reversed(text.splitlines()))
    for variant in (reversed_lines, text.replace("\n", "\r\n"), text.rstrip("\n")):
        assert parse_vllm_metrics(variant) == expected
    lookalike = text + 'vllm:num_requests_running_extra{engine="0"} 7.0\n'
    assert parse_vllm_metrics(lookalike) == expected
