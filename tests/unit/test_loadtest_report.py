"""Figures and tables of a benchmark, from hand-made runs (no sockets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtest.client import RequestRecord
from loadtest.driver import DriveResult
from loadtest.measure import MeasuredRun
from loadtest.replica_metrics import LoadSample, ReplicaDelta, parse_counters
from loadtest.report import markdown_table, write_outputs
from loadtest.results import ContenderResult
from loadtest.summary import percentile, summarize


def _run(label: str = "prefixgate:prefix") -> MeasuredRun:
    records = tuple(
        RequestRecord(conversation=f"c{i}", group="g", turn=0, sent_at=i * 0.1,
                      ttft=0.01 * (i + 1), tpot=0.001, e2e=0.05 + 0.01 * i, prompt_tokens=100,
                      completion_tokens=10, cached_tokens=50, usage_reported=True,
                      replica="sim0" if i % 2 else "sim1")
        for i in range(10)
    ) + (RequestRecord(conversation="bad", group="g", turn=0, sent_at=0.5, error="HTTP 503: x"),)
    drive = DriveResult(records, (), 1.2, unsent=2, abandoned=1)
    replicas = (ReplicaDelta("http://a", 300, 500, 6, 500), ReplicaDelta("http://b", 100, 500, 4, 500))
    load = (LoadSample(0.0, (2.0, 0.0)), LoadSample(0.5, (4.0, 2.0)))
    return MeasuredRun(label, "shared-prefix", ("http://a", "http://b"), drive, replicas, load)


def test_percentile_interpolates() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5
    assert percentile([5.0], 99) == 5.0


def test_summary_figures() -> None:
    summary = summarize(_run())
    assert summary.requests == 11 and summary.ok == 10 and summary.errors == 1
    assert summary.hit_rate == pytest.approx(0.4)
    assert summary.replicas[0].hit_rate == pytest.approx(0.6)
    assert summary.client_cached_ratio == pytest.approx(0.5)
    assert summary.max_mean_load == pytest.approx(3.0 / 2.0)
    assert summary.requests_by_header == {"sim0": 5, "sim1": 5}
    assert summary.ttft.p50 == pytest.approx(0.055)
    assert summary.error_kinds == {"HTTP 503: x": 1}


def test_table_has_every_contender(tmp_path: Path) -> None:
    results = [ContenderResult("prefixgate:prefix", run=_run()),
               ContenderResult.failed("vllm-router:cache_aware", "install failed\npip said no")]
    table = markdown_table(results, bound=0.5)
    assert "| prefixgate:prefix | 40.0% | 80.0% |" in table
    assert "| vllm-router:cache_aware | unavailable: install failed |" in table
    paths = write_outputs(tmp_path, {"command": "x"}, results, 0.5, "title")
    document = json.loads(paths["json"].read_text())
    assert [c["status"] for c in document["contenders"]] == ["ok", "unavailable"]
    assert document["contenders"][0]["of_bound"] == pytest.approx(0.8)
    assert len(paths["requests"].read_text().splitlines()) == 11


def test_a_result_is_a_run_or_a_reason() -> None:
    with pytest.raises(ValueError):
        ContenderResult("x")


def test_parse_counters_sums_label_sets() -> None:
    text = """# HELP vllm:prefix_cache_hits_total x
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 10.0
vllm:prefix_cache_hits_total{engine="1",model_name="m"} 5.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 40.0
vllm:request_success_total{finished_reason="stop"} 3.0
vllm:request_success_total{finished_reason="length"} 4.0
vllm:request_success_created{finished_reason="length"} 1.7e9
vllm:num_requests_running 2.0
"""
    counters = parse_counters(text)
    assert counters.prefix_hits == 15.0 and counters.prefix_queries == 40.0
    assert counters.requests == 7.0 and counters.running == 2.0


def test_histogram_quantile_interpolates_inside_a_bucket() -> None:
    from loadtest.histogram import delta, parse_buckets, quantile

    text = """x_bucket{le="0.001"} 50.0
x_bucket{le="0.002"} 90.0
x_bucket{le="+Inf"} 100.0
y_bucket{le="0.001"} 7.0
"""
    buckets = parse_buckets(text, "x")
    assert buckets[0.001] == 50.0
    assert quantile(buckets, 0.5) == pytest.approx(0.001)
    assert quantile(buckets, 0.7) == pytest.approx(0.0015)
    assert quantile(buckets, 0.99) == pytest.approx(0.002)  # past the last finite bound
    assert quantile(delta(buckets, buckets), 0.5) is None
