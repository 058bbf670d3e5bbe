"""What stalls the gateway's loop is measured: late wake-ups and garbage collections."""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client import CollectorRegistry, Histogram

from gateway.loop_lag import GcPauses, LoopLagProbe

from .fake_replica import FakeReplica
from .test_gateway_core import CHAT, gateway


def _count(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name + "_count", labels) or 0.0


def test_a_blocked_loop_shows_as_lag() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("lag_seconds", "lag", registry=registry, buckets=(0.001, 0.01, 0.1))

    async def main() -> None:
        probe = LoopLagProbe(histogram, period=0.01)
        probe.start()
        await asyncio.sleep(0.05)
        time.sleep(0.06)  # noqa: ASYNC251 - a handler that holds the loop
        await asyncio.sleep(0.03)
        await probe.aclose()

    asyncio.run(main())
    over = _count(registry, "lag_seconds") - (
        registry.get_sample_value("lag_seconds_bucket", {"le": "0.01"}) or 0.0)
    assert over >= 1  # at least one wake-up came more than 10 ms late


def test_collections_are_timed_by_generation_until_stopped() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("gc_seconds", "gc", ["generation"], registry=registry)
    pauses = GcPauses(histogram)
    pauses.start()
    try:
        gc.collect()
        gc.collect(0)
    finally:
        pauses.stop()
    assert _count(registry, "gc_seconds", generation="2") >= 1
    assert _count(registry, "gc_seconds", generation="0") >= 1
    assert (registry.get_sample_value("gc_seconds_sum", {"generation": "2"}) or 0) > 0
    before = _count(registry, "gc_seconds", generation="2")
    gc.collect()
    assert _count(registry, "gc_seconds", generation="2") == before


async def test_a_serving_gateway_freezes_its_start_up_and_spaces_full_collections() -> None:
    before = gc.get_threshold()
    async with gateway([FakeReplica("a")]) as client:
        assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        # what start-up loaded is out of the collector's sight while serving ...
        assert gc.get_freeze_count() > 10_000
        assert gc.get_threshold()[2] >= 100
    # ... and handed back when the gateway stops (an embedding process keeps its own)
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
