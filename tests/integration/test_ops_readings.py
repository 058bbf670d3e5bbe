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

import pytest

from gateway.ops.load import LoadReading
from gateway.ops.stats import Totals
from gateway.ops.worker_readings import local_readings
from loadtest import sampler_cost


async def test_the_sampler_reads_what_a_full_collection_gives() -> None:
    # 12 requests to 2 replicas, every other one streamed; the first for an unknown model
    async with sampler_cost.gateway_after_traffic(2, 12) as (registry, ids):
        replicas_read, load_read = local_readings(registry, ids)
        replicas_full, load_full = sampler_cost.full_readings(registry, ids)
    assert replicas_read == replicas_full
    assert sum(reading.raw.requests for reading in replicas_read) == 11  # the 404: no replica
    assert sum(reading.raw.errors for reading in replicas_read) == 0  # each answered 200
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
