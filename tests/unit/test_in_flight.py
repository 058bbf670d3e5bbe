"""Work under way by key (gateway.prompt.in_flight): later callers share the first's result."""

from __future__ import annotations

import asyncio

import pytest

from gateway.prompt.in_flight import InFlight


async def test_a_second_caller_gets_the_first_callers_result_and_the_key_is_freed() -> None:
    running: InFlight[str, int] = InFlight()
    go = asyncio.Event()

    async def work() -> list[int]:
        await go.wait()
        return [1, 2]

    task = running.start(["a", "b"], work())
    share = running.get("b")
    assert share is not None and running.get("c") is None
    go.set()
    assert await task == [1, 2] and await share == 2
    assert running.get("a") is None and len(running) == 0


async def test_the_starter_leaving_does_not_strand_the_others() -> None:
    """The request that started the work is cancelled (its client left): the work goes on."""
    running: InFlight[str, int] = InFlight()
    go = asyncio.Event()

    async def work() -> list[int]:
        await go.wait()
        return [7]

    task = running.start(["a"], work())
    starter = asyncio.ensure_future(asyncio.shield(task))
    await asyncio.sleep(0)
    starter.cancel()
    share = running.get("a")
    assert share is not None
    go.set()
    assert await asyncio.shield(share) == 7


async def test_a_failure_reaches_every_waiter() -> None:
    running: InFlight[str, int] = InFlight()

    async def work() -> list[int]:
        raise ValueError("tokenizer failed")

    task = running.start(["a"], work())
    share = running.get("a")
    assert share is not None
    with pytest.raises(ValueError):
        await task
    with pytest.raises(ValueError):
        await share
    assert len(running) == 0
