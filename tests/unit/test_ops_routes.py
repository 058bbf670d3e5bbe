"""/admin/replicas, /dashboard and the ops series of /metrics against fake replicas."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from asgi_lifespan import LifespanManager
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.config import load_settings
from gateway.ops_view import DriftNotice, LintFindingStat, OpsView

from .fake_replica import FakeReplica

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
        view: OpsView = client.app.state.ops_view  # type: ignore[attr-defined]
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


async def test_metrics_carry_the_ops_series() -> None:
    a, b = FakeReplica("a"), FakeReplica("b", up=False)
    async with gateway([a, b]) as client:
        state = client.app.state.gateway  # type: ignore[attr-defined]
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
