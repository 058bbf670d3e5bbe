"""/admin/replicas, /dashboard and the ops series of /metrics against fake replicas."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import pytest
from asgi_lifespan import LifespanManager
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import CapacitySettings, ConfigError, load_settings
from gateway.ops.view import DriftNotice, LintFindingStat, OpsView
from gateway.replicas.capacity import planned_blocks
from gateway.server.app import create_app

from .fake_replica import FakeReplica
from .test_kv_plan import QWEN25_72B

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello " * 40}]}


@asynccontextmanager
async def gateway(replicas: list[FakeReplica], **settings: object
                  ) -> AsyncIterator[httpx.AsyncClient]:
    overrides = {"replicas": [{"id": r.name, "url": f"http://{r.name}", "model": r.model}
                              for r in replicas],
                 "health_interval": 3600.0, **settings}
    by_id = {r.name: r for r in replicas}
    app = create_app(load_settings(overrides=overrides, env={}),
                     transport=lambda rid: by_id[rid].transport())
    async with LifespanManager(app) as manager, httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://gw") as client:
        client.app = app  # type: ignore[attr-defined]
        yield client


async def test_admin_replicas_describes_every_replica() -> None:
    a, b = FakeReplica("a"), FakeReplica("b")
    async with gateway([a, b], policy="prefix") as client:
        for _ in range(3):
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        data = (await client.get("/admin/replicas")).json()
    assert data["policy"] == "prefix"
    assert (data["replicas_total"], data["replicas_healthy"]) == (2, 2)
    by_id = {r["id"]: r for r in data["replicas"]}
    assert set(by_id) == {"a", "b"}
    served = [r for r in by_id.values() if r["requests_total"]]
    assert sum(r["requests_total"] for r in served) == 3
    first = served[0]
    assert first["url"] == f"http://{first['id']}"
    assert (first["model"], first["kind"]) == ("m", "remote")
    assert (first["block_size"], first["capacity_blocks"]) == (32, 1000)
    assert first["capacity_tokens"] == 32000
    assert first["kv_cache_dtype"] == "fp8"
    assert first["indexed_blocks"] is not None and first["indexed_blocks"] > 0
    assert 0 <= first["predicted_hit_rate_total"] <= 1
    # Non-streaming answers have no first token to time.
    assert first["ttft_p50_1m_s"] is None
    assert set(first["history"]) >= {"age_s", "predicted_hit_rate", "actual_hit_rate",
                                     "running", "waiting", "inflight", "kv_usage",
                                     "ttft_p50_s", "ttft_p99_s", "healthy"}
    assert data["lint_findings"] == [] and data["drift_events"] == []


async def test_the_prefill_speed_the_queue_drains_at_is_shown() -> None:
    """An operator compares it with the measured one (``prefill_tokens_per_s``)."""
    async with gateway([FakeReplica("a")], policy="prefix") as client:
        [plain] = (await client.get("/admin/replicas")).json()["replicas"]
    async with gateway([FakeReplica("a")], policy="prefix",
                       policy_options={"prefill_seconds_per_token": 0.0005}) as client:
        [declared] = (await client.get("/admin/replicas")).json()["replicas"]
    assert plain["assumed_prefill_tokens_per_s"] == 10000
    assert declared["assumed_prefill_tokens_per_s"] == 2000


async def test_a_down_replica_is_reported_with_its_error() -> None:
    a, b = FakeReplica("a"), FakeReplica("b", up=False)
    async with gateway([a, b], policy="least_load") as client:
        data = (await client.get("/admin/replicas")).json()
    down = next(r for r in data["replicas"] if r["id"] == "b")
    assert down["healthy"] is False
    assert down["last_error"]
    assert down["indexed_blocks"] is None  # least_load keeps no prefix index
    assert data["replicas_healthy"] == 1


async def test_lint_and_drift_hooks_show_up_sorted_and_capped() -> None:
    async with gateway([FakeReplica("a")]) as client:
        view: OpsView = client.app.ops_view  # type: ignore[attr-defined]
        view.lint_provider = lambda: [LintFindingStat(f"kind{i}", count=i) for i in range(15)]
        view.drift_provider = lambda: [DriftNotice(at=100.0, model="m", kind="tools"),
                                       DriftNotice(at=200.0, model="m", kind="system_prompt",
                                                  lost_tokens=512)]
        data = (await client.get("/admin/replicas")).json()
    assert [f["count"] for f in data["lint_findings"]] == list(range(14, 4, -1))
    assert [e["kind"] for e in data["drift_events"]] == ["system_prompt", "tools"]
    assert data["drift_events"][0]["lost_tokens"] == 512


async def test_dashboard_is_one_self_contained_page() -> None:
    async with gateway([FakeReplica("a")]) as client:
        response = await client.get("/dashboard")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in response.headers["content-security-policy"]
    page = response.text
    assert 'fetch("admin/replicas"' in page
    # Nothing is loaded from elsewhere: no src/href to another origin, no @import.
    for ref in re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', page):
        assert ref.startswith("data:"), ref
    assert "@import" not in page and "<iframe" not in page


async def test_the_gateways_own_load_is_in_the_ops_view_and_metrics() -> None:
    async with gateway([FakeReplica("a")]) as client:
        for _ in range(3):
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        load = (await client.get("/admin/replicas")).json()["gateway"]
        samples = scrape((await client.get("/metrics")).text)
    # at rest once answered: nothing being prepared or held; the linter's queue is read
    assert (load["requests_preparing"], load["requests_open"]) == (0, 0)
    assert load["lint_queue"] is not None and load["lint_queue"] >= 0
    assert load["cpu_cores_1m"] is not None and load["cpu_cores_1m"] > 0  # start-up, requests
    assert load["overhead_p99_1m_s"] is not None  # three requests left for the replica
    assert samples[("prefixgate_requests_preparing", ())] == 0
    assert samples[("prefixgate_requests_open", ())] == 0
    assert samples[("prefixgate_process_cpu_seconds_total", ())] > 0


async def test_metrics_carry_the_ops_series() -> None:
    a, b = FakeReplica("a"), FakeReplica("b", up=False)
    async with gateway([a, b]) as client:
        state = client.app.gateway  # type: ignore[attr-defined]
        state.metrics.lint_findings.labels("timestamp_in_system_prompt").inc()
        state.metrics.prefix_drift_events.labels("m").inc(2)
        text = (await client.get("/metrics")).text
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("prefixgate_healthy_replicas", (("model", "m"),))] == 1
    assert samples[("prefixgate_replicas", (("model", "m"),))] == 2
    assert samples[("prefixgate_replica_info",
                    (("kind", "remote"), ("model", "m"), ("replica", "b")))] == 1
    assert samples[("prefixgate_lint_findings_total",
                    (("kind", "timestamp_in_system_prompt"),))] == 1
    assert samples[("prefixgate_prefix_drift_events_total", (("model", "m"),))] == 2


def scrape(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def requests_total(samples: dict, replica: str, status: str) -> float:
    return sum(v for (name, labels), v in samples.items()
               if name == "prefixgate_requests_total"
               and dict(labels)["replica"] == replica and dict(labels)["status"] == status)


async def test_the_gateways_own_errors_are_counted_by_status() -> None:
    a = FakeReplica("a")
    async with gateway([a]) as client:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert (await client.post("/v1/chat/completions", content=b"{nope")).status_code == 400
        assert (await client.post("/v1/nowhere", json=CHAT)).status_code == 404
        a.up = False  # every try fails before the first byte: the gateway answers 502
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 502
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code in (502, 503)
        samples = scrape((await client.get("/metrics")).text)
    assert requests_total(samples, "a", "200") == 1
    assert requests_total(samples, "none", "400") == 1
    assert requests_total(samples, "none", "404") == 1
    gateway_errors = requests_total(samples, "none", "502") + requests_total(samples, "none",
                                                                             "503")
    assert gateway_errors == 2
    # The model was known for the 502: it is labelled with it.
    assert samples[("prefixgate_requests_total",
                    (("model", "m"), ("replica", "none"), ("status", "502")))] >= 1


async def test_counters_exist_at_zero_from_start_up() -> None:
    async with gateway([FakeReplica("a"), FakeReplica("b")]) as client:
        samples = scrape((await client.get("/metrics")).text)
    for replica in ("a", "b"):
        assert samples[("prefixgate_failovers_total", (("replica", replica),))] == 0
        assert samples[("prefixgate_stream_errors_total", (("replica", replica),))] == 0
        assert samples[("prefixgate_requests_total",
                        (("model", "m"), ("replica", replica), ("status", "200")))] == 0
    assert samples[("prefixgate_requests_total",
                    (("model", "m"), ("replica", "none"), ("status", "503")))] == 0
    assert samples[("prefixgate_lint_findings_total", (("kind", "timestamp"),))] == 0
    assert samples[("prefixgate_prefix_drift_events_total", (("model", "m"),))] == 0


async def test_the_ops_view_reads_the_same_series_as_metrics() -> None:
    a, b = FakeReplica("a"), FakeReplica("b")
    async with gateway([a, b], policy="prefix") as client:
        for _ in range(4):
            await client.post("/v1/chat/completions", json=CHAT)
        stream = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", "/v1/chat/completions", json=stream) as response:
            await response.aread()
        samples = scrape((await client.get("/metrics")).text)
        data = (await client.get("/admin/replicas")).json()
    for row in data["replicas"]:
        rid = row["id"]
        assert row["requests_total"] == requests_total(samples, rid, "200")
        assert row["prompt_tokens_total"] == samples[
            ("prefixgate_prompt_tokens_total", (("replica", rid),))]
        assert row["completion_tokens_total"] == samples[
            ("prefixgate_completion_tokens_total", (("replica", rid),))]
        streams = samples.get(("prefixgate_time_to_first_token_seconds_count",
                               (("replica", rid),)), 0)
        assert row["ttft_samples_1m"] == streams
        assert (row["ttft_p50_1m_s"] is None) == (streams == 0)
    assert sum(r["ttft_samples_1m"] for r in data["replicas"]) == 1


async def test_answers_say_why_they_went_where_they_went() -> None:
    a, b = FakeReplica("a"), FakeReplica("b")
    async with gateway([a, b], policy="prefix") as client:
        first = await client.post("/v1/chat/completions", json=CHAT)
        second = await client.post("/v1/chat/completions", json=CHAT)
        served = second.headers["x-prefixgate-replica"]
        other = next(r for r in (a, b) if r.name != served)
        (a if served == "a" else b).up = False
        moved = await client.post("/v1/chat/completions", json=CHAT)
    assert first.headers["x-prefixgate-reason"] == "miss"
    assert second.headers["x-prefixgate-reason"] == "hit"
    assert int(second.headers["x-prefixgate-matched-tokens"]) > 0
    assert second.headers["x-prefixgate-runner-up"] == other.name
    assert second.headers["x-prefixgate-runner-up-matched-tokens"] == "0"
    assert moved.headers["x-prefixgate-replica"] == other.name
    assert moved.headers["x-prefixgate-reason"] == "failover"


async def test_a_replica_that_publishes_no_capacity_gets_the_planners(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(QWEN25_72B))
    capacity = {"config": str(tmp_path), "tensor_parallel_size": 4, "gpu_memory_gb": 80,
                "kv_cache_dtype": "fp8", "block_size": 16}
    expected = planned_blocks(CapacitySettings(**capacity))
    silent, publishing = FakeReplica("a", publishes_capacity=False), FakeReplica("b")
    by_id = {r.name: r for r in (silent, publishing)}
    settings = load_settings(overrides={
        "replicas": [{"id": r, "url": f"http://{r}", "model": "m", "capacity": capacity}
                     for r in by_id],
        "health_interval": 3600.0}, env={})
    app = create_app(settings, transport=lambda rid: by_id[rid].transport())
    async with LifespanManager(app) as manager, httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://gw") as client:
        data = (await client.get("/admin/replicas")).json()
        views = {v.id: v for v in app.gateway.pool.snapshot("m")}
    rows = {r["id"]: r for r in data["replicas"]}
    assert expected > 1000
    assert (rows["a"]["capacity_blocks"], rows["a"]["capacity_source"]) == (expected, "plan")
    # What the replica publishes wins over the plan.
    assert (rows["b"]["capacity_blocks"], rows["b"]["capacity_source"]) == (1000, "replica")
    assert (views["a"].block_capacity, views["b"].block_capacity) == (expected, 1000)


async def test_a_capacity_the_planner_cannot_compute_stops_start_up(tmp_path) -> None:
    settings = load_settings(overrides={
        "replicas": [{"id": "a", "url": "http://a", "model": "m",
                      "capacity": {"config": str(tmp_path / "missing")}}]}, env={})
    app = create_app(settings, transport=lambda rid: FakeReplica("a").transport())
    with pytest.raises(ConfigError, match="replica capacity"):
        async with LifespanManager(app):
            pass
