"""Routes vLLM 0.32 serves beyond the classic ones (a batch of chats, token-in-token-out
generation, SageMaker's invocations, the Messages API's render, derendering, generative
scoring, structured decisions): relayed at their own path, routed by the prompt they carry
where they carry one. Before, each was the gateway's 404."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from .fake_replica import FakeReplica
from .test_gateway_core import gateway

SYSTEM = "You are the assistant of a shop. Answer from the catalogue, politely. " * 24


def chat(question: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]


async def _home_then(body: dict[str, Any], path: str,
                     first: tuple[str, dict[str, Any]] | None = None) -> list[Any]:
    replicas = [FakeReplica(name) for name in ("a", "b", "c")]
    first = first or ("/v1/chat/completions", {"model": "m", "messages": chat("Hello?")})
    async with gateway(replicas, policy="prefix") as client:
        home = await client.post(first[0], json=first[1])
        answer = await client.post(path, json=body)
    return [home, answer, replicas]


async def test_a_batch_of_chats_routes_by_its_first_conversation() -> None:
    body = {"model": "m", "max_tokens": 4,
            "messages": [chat("Do you sell lamps?"), [{"role": "user", "content": "Other"}]]}
    home, answer, replicas = await _home_then(body, "/v1/chat/completions/batch")
    assert answer.status_code == 200
    assert answer.headers["x-prefixgate-replica"] == home.headers["x-prefixgate-replica"]
    assert answer.headers["x-prefixgate-reason"] == "hit"
    assert int(answer.headers["x-prefixgate-matched-tokens"]) > 100
    assert [r for replica in replicas for r in replica.requests][-1] == body  # as sent


async def test_token_in_token_out_generation_routes_by_its_token_ids() -> None:
    ids = list(range(1000, 1400))
    first = ("/inference/v1/generate", {"model": "m", "token_ids": ids,
                                        "sampling_params": {"max_tokens": 4}})
    body = {"model": "m", "token_ids": [*ids, 7, 8, 9], "sampling_params": {"max_tokens": 4}}
    home, answer, _ = await _home_then(body, "/inference/v1/generate", first)
    assert home.headers["x-prefixgate-reason"] == "miss"  # analysed: 400 tokens, new
    assert answer.headers["x-prefixgate-replica"] == home.headers["x-prefixgate-replica"]
    assert int(answer.headers["x-prefixgate-matched-tokens"]) >= 384


@pytest.mark.parametrize(("body", "matched"), [
    ({"messages": chat("Do you sell lamps?"), "max_tokens": 4}, True),
    ({"prompt": "Once upon a time", "max_tokens": 4}, False),
    ({"input": "embed me"}, False),
])
async def test_sagemaker_invocations_route_as_vllm_serves_them(body: dict[str, Any],
                                                                matched: bool) -> None:
    home, answer, _ = await _home_then(body, "/invocations")
    assert answer.status_code == 200
    assert (int(answer.headers["x-prefixgate-matched-tokens"]) > 100) is matched
    if matched:
        assert answer.headers["x-prefixgate-replica"] == home.headers["x-prefixgate-replica"]


async def test_the_other_new_routes_reach_the_replica_at_their_own_path() -> None:
    replica = FakeReplica("a")
    paths: dict[str, dict[str, Any]] = {"/v1/messages/render": {"max_tokens": 4, "messages": chat("Hi")},
             "/v1/chat/completions/derender": {"token_ids": [1, 2]},
             "/v1/completions/derender": {"token_ids": [1, 2]},
             "/generative_scoring": {"query": "q", "items": ["a"], "label_token_ids": [1]},
             "/v1/systemone": {"state": {}, "questions": []}}
    async with gateway([replica], policy="prefix") as client:
        for path, body in paths.items():
            answer = await client.post(path, json={"model": "m", **body})
            assert answer.status_code == 200, (path, answer.text)
            assert answer.headers["x-prefixgate-replica"] == "a"
    assert [request for request in replica.requests] == [
        {"model": "m", **body} for body in paths.values()]


class JsonBatchReplica(FakeReplica):
    """Answers a batch of chats with one JSON body even when asked to stream, as vLLM 0.32
    does; the body is larger than what a stream's observer keeps of its tail."""

    async def handle(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/v1/chat/completions/batch":
            return await super().handle(request)
        self.requests.append(json.loads(request.content))
        choices = [{"index": i, "message": {"role": "assistant", "content": "x" * 400},
                    "finish_reason": "length"} for i in range(60)]
        return httpx.Response(200, json={
            "id": "chatcmpl-batch", "object": "chat.completion", "model": self.model,
            "choices": choices, "usage": {"prompt_tokens": 900, "completion_tokens": 240,
                                          "prompt_tokens_details": {"cached_tokens": 512}}})


async def test_a_batch_answered_with_json_to_a_stream_request_has_its_usage_read() -> None:
    replica = JsonBatchReplica("a")
    body = {"model": "m", "max_tokens": 4, "stream": True,
            "messages": [chat("Do you sell lamps?"), [{"role": "user", "content": "Other"}]]}
    async with gateway([replica], policy="prefix") as client:
        answer = await client.post("/v1/chat/completions/batch", json=body)
        assert answer.status_code == 200 and len(answer.json()["choices"]) == 60  # relayed
        metrics = (await client.get("/metrics")).text
    assert 'prefixgate_usage_prompt_tokens_total{replica="a"} 900.0' in metrics
    assert 'prefixgate_completion_tokens_total{replica="a"} 240.0' in metrics
    assert 'prefixgate_usage_cached_tokens_total{replica="a"} 512.0' in metrics
