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
    """Answers probes; its completions hang (a replica stuck in its engine), all of
    them, or only the first ``hang_first`` (a replica stuck on some requests that
    goes on serving others)."""

    waiting: int = 0
    hang_first: int | None = None

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.startswith("/v1/chat"):
            self.waiting += 1
            if self.hang_first is None or self.waiting <= self.hang_first:
                await asyncio.Event().wait()
        return await super().handle(request)


def not_retried(client: httpx.AsyncClient, replica: str) -> float:
    metrics = client.app.gateway.metrics  # type: ignore[attr-defined]
    return metrics.not_retried.labels(replica)._value.get()


async def test_a_request_a_replica_stopped_with_is_answered_at_once_not_sent_on() -> None:
    """A query of death: the replica stops with this request and shows no sign of life
    after it arrived. Sent on, it would stop the next replica too (and the next)."""
    hung, good = HungReplica("a"), FakeReplica("b")
    async with gateway([hung, good], policy="round_robin",
                       timeouts={"first_byte": 0.2}) as client:
        answers = await asyncio.gather(*(
            client.post("/v1/chat/completions", json={**CHAT, "stream": True})
            for _ in range(2)))
        statuses = sorted(a.status_code for a in answers)
        assert statuses == [200, 504]
        error = assert_openai_error(next(a for a in answers if a.status_code == 504), 504)
        assert "not retried on another replica" in error["message"]
        assert hung.waiting == 1 and len(good.requests) == 1   # b never saw it
        assert not_retried(client, "a") == 1
        # one stuck request on an otherwise idle replica is the request's: a stays in
        # rotation (its probes answer); several stuck at once are a wedged engine
        pool = client.app.gateway.pool  # type: ignore[attr-defined]
        assert pool.get("a").healthy
        stuck = await asyncio.gather(*(
            client.post("/v1/chat/completions", json={**CHAT, "stream": True})
            for _ in range(4)))
        codes = sorted(a.status_code for a in stuck)
        assert codes[:2] == [200, 200] and set(codes[2:]) <= {502, 504}
        assert not pool.get("a").healthy
        assert not_retried(client, "a") == 3


async def test_a_request_waiting_on_a_replica_that_dies_after_working_goes_on_at_once() -> None:
    """A replica killed or stopped under load: it answered another request after this
    one arrived, so this one did not stop it; it is sent to the next replica."""
    hung, good = HungReplica("a", hang_first=1), FakeReplica("b")
    async with gateway([hung, good], policy="round_robin") as client:
        pool = client.app.gateway.pool  # type: ignore[attr-defined]
        stuck = asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT))
        await eventually(lambda: hung.waiting == 1, what="a request waiting on a")
        others = await asyncio.gather(*(client.post("/v1/chat/completions", json=CHAT)
                                        for _ in range(2)))
        assert sorted(o.headers["x-prefixgate-replica"] for o in others) == ["a", "b"]
        pool.report_failure("a", "health probes timed out")  # what the probe loop does
        answer = await stuck
        assert answer.status_code == 200 and answer.headers["x-prefixgate-replica"] == "b"
        assert answer.headers["x-prefixgate-reason"] == "failover"
        assert not_retried(client, "a") == 0


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


async def test_while_draining_no_new_generation_starts_on_any_route() -> None:
    """During the drain period (a request still running), new generation is refused at
    the door on every route that generates, not only under /v1/: SageMaker's invocations
    and token-in-token-out generation too (before, they started on the replica); the
    Messages API's refusal in its own shape."""
    hung = HungReplica("a", hang_first=1)
    async with gateway([hung], drain_seconds=30) as client:
        waiting = asyncio.ensure_future(client.post("/v1/chat/completions", json=CHAT))
        await eventually(lambda: hung.waiting == 1, what="a request waiting on a")
        drain = client.app.drain  # type: ignore[attr-defined]
        draining = asyncio.ensure_future(drain.run())
        await eventually(lambda: drain.draining, what="the drain started")
        answers = {path: await client.post(path, json={**CHAT, "token_ids": [1, 2, 3]})
                   for path in ("/invocations", "/inference/v1/generate")}
        messages = await client.post("/v1/messages", json={**CHAT, "max_tokens": 4})
        assert not drain.cut_done
        draining.cancel()
        waiting.cancel()
    for path, answer in answers.items():
        assert assert_openai_error(answer, 503)["code"] == "gateway_draining", path
    assert messages.status_code == 503 and messages.json()["type"] == "error"
    assert hung.requests == []  # nothing new reached it (the running chat hangs unrecorded)
