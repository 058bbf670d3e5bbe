"""How many workers a gateway runs, and one /metrics made of several workers' texts."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import ConfigError, Settings, load_settings
from gateway.ops.worker_metrics import merge_expositions
from gateway.server.workers import available_cores, resolve_workers, single_process_reasons

REPLICA = {"url": "http://r0:8000", "model": "m"}


def settings(**extra: object) -> Settings:
    return Settings.model_validate({"replicas": [REPLICA], **extra})


def test_auto_is_half_the_cores_and_at_least_one() -> None:
    assert resolve_workers(settings(), cores=2) == 1
    assert resolve_workers(settings(), cores=1) == 1
    assert resolve_workers(settings(), cores=16) == 8
    assert resolve_workers(settings(workers=3), cores=2) == 3  # asked for: given
    assert resolve_workers(settings(), cores=16, embedded=True) == 1  # they take the cores
    assert resolve_workers(settings(workers=2), cores=16, embedded=True) == 2


@pytest.mark.parametrize("extra, reason", [
    ({"api_keys": "keys.yaml"}, "set redis_url"),
    ({"trace": {"path": "/tmp/trace.jsonl"}}, "trace file"),
    ({"replicas": [{"kind": "inprocess", "id": "e0", "vllm": {"model": "m"}}]},
     "inprocess replica"),
])
def test_state_a_second_process_would_not_share_keeps_one(extra: dict[str, object],
                                                         reason: str) -> None:
    one = settings(**extra)
    assert resolve_workers(one, cores=16) == 1
    assert any(reason in why for why in single_process_reasons(one))
    with pytest.raises(ValueError, match=reason):
        resolve_workers(settings(workers=4, **extra), cores=16)


def test_client_keys_with_redis_may_have_several_workers() -> None:
    shared = settings(api_keys="keys.yaml", redis_url="redis://127.0.0.1:6379/0")
    assert single_process_reasons(shared) == []
    assert resolve_workers(shared, cores=8) == 4


def test_workers_from_the_environment_and_its_bounds() -> None:
    base = {"PREFIXGATE_REPLICAS": "http://r0:8000"}
    assert load_settings(env={**base, "PREFIXGATE_WORKERS": "4"}).workers == 4
    assert load_settings(env={**base, "PREFIXGATE_WORKERS": "auto"}).workers == "auto"
    for bad in ("0", "65", "many"):
        with pytest.raises(ConfigError, match="workers"):
            load_settings(env={**base, "PREFIXGATE_WORKERS": bad})


def test_a_cgroup_quota_caps_the_cores(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert available_cores(str(tmp_path)) == 2  # 1.5 CPUs: two cores' worth of threads
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cores(str(tmp_path)) >= 1
    assert available_cores(str(tmp_path / "absent")) >= 1


def exposition(requests: int, lag_seconds: float, healthy: float) -> bytes:
    registry = CollectorRegistry()
    counter = Counter("prefixgate_requests", "Requests answered.", ["replica"],
                      registry=registry)
    counter.labels("r0").inc(requests)
    lag = Histogram("prefixgate_event_loop_lag_seconds", "Lag.", buckets=(0.001, 0.01),
                    registry=registry)
    lag.observe(lag_seconds)
    Gauge("prefixgate_replica_healthy", "Healthy.", ["replica"],
          registry=registry).labels("r0").set(healthy)
    return generate_latest(registry)


def test_merged_metrics_label_each_worker_and_keep_families_whole() -> None:
    merged = merge_expositions({1: exposition(5, 0.005, 1), 0: exposition(3, 0.0005, 1)})
    text = merged.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    requests = {s.labels["worker"]: s.value for s in families["prefixgate_requests"].samples
                if s.name == "prefixgate_requests_total"}
    assert requests == {"0": 3.0, "1": 5.0}
    buckets = {(s.labels["worker"], s.labels["le"]): s.value
               for s in families["prefixgate_event_loop_lag_seconds"].samples
               if s.name.endswith("_bucket")}
    assert buckets[("0", "0.001")] == 1.0 and buckets[("1", "0.001")] == 0.0
    assert buckets[("1", "0.01")] == 1.0
    assert text.count("# TYPE prefixgate_requests_total counter") == 1
    assert text.count("# HELP prefixgate_replica_healthy ") == 1
    assert merge_expositions({}) == b""


def test_the_ops_view_reads_several_workers_as_one_gateway() -> None:
    from gateway.ops.worker_readings import encode_readings, local_readings, merge_readings

    def worker_readings(requests: int, inflight: int, hits: int, cpu: float) -> bytes:
        registry = CollectorRegistry()
        Counter("prefixgate_requests", "r", ["model", "replica", "status"],
                registry=registry).labels("m", "r0", "200").inc(requests)
        Gauge("prefixgate_replica_inflight_requests", "i", ["replica"],
              registry=registry).labels("r0").set(inflight)
        Gauge("prefixgate_replica_healthy", "h", ["replica"],
              registry=registry).labels("r0").set(1)
        Counter("prefixgate_replica_prefix_cache_hits_tokens", "h", ["replica"],
                registry=registry).labels("r0").inc(hits)
        Counter("prefixgate_process_cpu_seconds", "c", registry=registry).inc(cpu)
        return encode_readings(local_readings(registry, ["r0"]))

    (reading,), load = merge_readings([worker_readings(3, 1, 640, 2.0),
                                       worker_readings(5, 2, 656, 1.5)])
    assert reading.raw.requests == 8  # each worker's answers: added up
    assert reading.inflight == 3
    assert reading.healthy
    assert reading.raw.cache_hits == 656  # the replica's own counter, read twice: one figure
    assert load.totals.count("cpu_seconds") == 3.5
