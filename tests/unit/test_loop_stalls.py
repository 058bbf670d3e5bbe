"""What stalls the gateway's loop is measured: late wake-ups and garbage collections."""

from __future__ import annotations

import asyncio
import gc
import selectors

import pytest
from prometheus_client import CollectorRegistry, Histogram

from gateway.ops.loop_lag import GcPauses, LoopLagMeter

from .fake_replica import FakeReplica
from .test_gateway_core import CHAT, gateway


def _count(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name + "_count", labels) or 0.0


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop on a clock the test moves: waiting for a timer costs no real time.

    Where the loop would block in ``select`` until the next timer, the clock
    jumps to it instead; ``hold`` is a handler keeping the loop busy for a
    while (the clock moves, nothing else runs).
    """

    def __init__(self) -> None:
        self.now = 0.0
        loop = self

        class Selector(selectors.DefaultSelector):
            def select(self, timeout: float | None = None
                       ) -> list[tuple[selectors.SelectorKey, int]]:
                if timeout is not None and timeout > 0:
                    loop.now += timeout
                return super().select(0)

        super().__init__(Selector())

    def time(self) -> float:
        return self.now

    def hold(self, seconds: float) -> None:
        self.now += seconds


def test_a_blocked_loop_shows_as_lag_and_an_idle_one_does_not() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("lag_seconds", "lag", registry=registry, buckets=(0.001, 0.01, 0.1))
    loop = VirtualTimeLoop()

    async def main() -> None:
        probe = LoopLagMeter(histogram, period=0.01)
        probe.start()
        await asyncio.sleep(0.055)  # five wake-ups, each on time
        loop.hold(0.06)  # a handler that keeps the loop for 60 ms
        await asyncio.sleep(0.03)
        await probe.aclose()

    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    wake_ups = _count(registry, "lag_seconds")
    on_time = registry.get_sample_value("lag_seconds_bucket", {"le": "0.001"})
    late = wake_ups - (registry.get_sample_value("lag_seconds_bucket", {"le": "0.01"}) or 0.0)
    assert wake_ups >= 7
    assert late == 1 and on_time == wake_ups - 1  # only the wake-up the handler held back
    # it came as late as the handler held the loop past the wake-up's due time
    assert registry.get_sample_value("lag_seconds_sum") == pytest.approx(0.055)


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
