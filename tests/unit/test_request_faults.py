"""Requests waiting on a replica that does not answer: the first-byte deadline, a
breaker that opens meanwhile, and the end of the drain (fake replicas, the app
driven through ASGITransport)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import httpx

from tests.support.waiting import eventually

from .fake_replica import FakeReplica
from .test_gateway_core import CHAT, assert_openai_error, gateway


@dataclass
class HungReplica(FakeReplica):
    """Answers probes, never its completions (a replica stuck in its engine)."""

    waiting: int = 0

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/v1/chat"):
            self.waiting += 1
            await asyncio.Event().wait()
        return await super().handle(request)


async def test_a_stream_without_a_first_token_in_time_goes_to_the_next_replica() -> None:
    hung, good = HungReplica("a"), FakeReplica("b")
    async with gateway([hung, good], policy="round_robin",
                       timeouts={"first_byte": 0.2}) as client:
        answers = await asyncio.gather(*(
            client.post("/v1/chat/completions", json={**CHAT, "stream": True})
            for _ in range(2)))
        assert [a.status_code for a in answers] == [200, 200]
        assert {a.headers["x-prefixgate-replica"] for a in answers} == {"b"}
        assert all(a.text.endswith("data: [DONE]\n\n") for a in answers)
        assert hung.waiting == 1
        assert not client.app.state.gateway.pool.get("a").healthy  # type: ignore[attr-defined]


async def test_a_request_waiting_on_a_replica_whose_breaker_opens_goes_on_at_once() -> None:
    hung, good = HungReplica("a"), FakeReplica("b")
    async with gateway([hung, good], policy="round_robin") as client:
        pool = client.app.state.gateway.pool  # type: ignore[attr-defined]
        tasks = [asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT))
                 for _ in range(2)]
        await eventually(lambda: hung.waiting == 1, what="a request waiting on a")
        pool.report_failure("a", "health probes timed out")  # what the probe loop does
        answers = await asyncio.gather(*tasks)
        assert [a.status_code for a in answers] == [200, 200]
        assert {a.headers["x-prefixgate-replica"] for a in answers} == {"b"}
        assert len(good.requests) == 2


async def test_the_end_of_the_drain_answers_a_waiting_request_503_and_refuses_new_ones() -> None:
    hung = HungReplica("a")
    async with gateway([hung], drain_seconds=0) as client:
        waiting = asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT))
        await eventually(lambda: hung.waiting == 1, what="a request waiting on a")
        drain = client.app.drain  # type: ignore[attr-defined]
        await drain.run()
        error = assert_openai_error(await waiting, 503)
        assert error["code"] == "gateway_draining"
        refused = await client.post("/v1/chat/completions", json=CHAT)
        assert assert_openai_error(refused, 503)["code"] == "gateway_draining"
        assert refused.headers["retry-after"]
        assert (await client.get("/ready")).status_code == 503
        assert (await client.get("/health")).status_code == 200
        assert hung.waiting == 1
