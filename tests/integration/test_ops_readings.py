"""The ops sampler reads only the series the ops view shows, and misses none of them.

Every two seconds the sampler reads the gateway's registry on the serving loop
(``gateway.ops.sampler``). A full collection of it took ~2 ms there (every
histogram and label set of the gateway's own metrics, most of which the ops
view never reads), a stall every request arriving meanwhile waited out; the
sampler now collects only the series ``read_registry`` and ``read_load`` read
(``worker_readings.READ_SERIES``). This checks, on a real gateway after real
traffic, that what the ops view gets from that narrower collection is what a
full collection gives.
"""

from __future__ import annotations

import dataclasses

import httpx
import pytest
from asgi_lifespan import LifespanManager

from gateway.config import load_settings
from gateway.ops.load import LoadReading, read_load
from gateway.ops.stats import Totals, read_registry
from gateway.ops.worker_readings import local_readings
from gateway.server.app import create_app
from loadtest import sampler_cost
from tests.unit.fake_replica import FakeReplica


async def test_the_sampler_reads_what_a_full_collection_gives() -> None:
    replicas = {name: FakeReplica(name) for name in ("r0", "r1")}
    settings = load_settings(overrides={
        "replicas": [{"id": name, "url": f"http://{name}"} for name in replicas],
        "health_interval": 3600.0, "policy": "prefix"}, env={})
    app = create_app(settings, transport=lambda rid: replicas[rid].transport())
    async with LifespanManager(app) as manager, httpx.AsyncClient(
            transport=httpx.ASGITransport(app=manager.app), base_url="http://gw") as client:
        for index in range(6):
            response = await client.post("/v1/chat/completions", json={
                "model": "m", "stream": index % 2 == 0, "max_tokens": 4,
                "messages": [{"role": "system", "content": "You are terse. " * 40},
                             {"role": "user", "content": f"question {index}"}]})
            assert response.status_code == 200, response.text
        await client.post("/v1/chat/completions", json={"model": "unknown", "messages": []})
        registry = app.gateway.metrics.registry
        ids = ["r0", "r1"]
        replicas_read, load_read = local_readings(registry, ids)
        full = list(registry.collect())
        replicas_full, load_full = read_registry(full, ids), read_load(full)
    assert replicas_read == replicas_full
    assert sum(reading.raw.requests for reading in replicas_read) == 6
    assert any(reading.raw.histograms.get("ttft") for reading in replicas_read)
    # The gateway's CPU time moves between the two collections; the rest may not.
    assert 0 < load_read.totals.count("cpu_seconds") <= load_full.totals.count("cpu_seconds")
    assert without_cpu(load_read) == without_cpu(load_full)
    assert load_read.totals.histograms.get("overhead")


def without_cpu(load: LoadReading) -> LoadReading:
    counters = {k: v for k, v in load.totals.counters.items() if k != "cpu_seconds"}
    return dataclasses.replace(load, totals=Totals(counters, load.totals.histograms))


def test_the_sampler_cost_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """``python -m loadtest.sampler_cost``: a row per replica count, both ways timed."""
    assert sampler_cost.main(["--replicas", "2,3", "--requests", "12", "--repeat", "3"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert [row.split("|")[1].strip() for row in rows[1:]] == ["2", "3"]
    assert all(row.count(" / ") == 2 for row in rows[1:])
