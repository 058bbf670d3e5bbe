"""Requests with images (audio, video, files) route on the text before them: a shared
system prompt still lands its requests where it is cached."""

from __future__ import annotations

from typing import Any

import pytest

from engine.tokenizer import HFRenderer
from gateway.prompt.bounds import Unanalysed, routable_chat
from gateway.prompt.render import PromptHasher

from .fake_replica import FakeReplica
from .test_gateway_core import gateway
from .test_hostile_requests import _sample

SYSTEM = {"role": "system", "content": "You are the catalogue assistant of a furniture shop. " * 30}


def _asking(n: int, part: dict[str, Any]) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 8, "messages": [
        SYSTEM, {"role": "user", "content": [{"type": "text", "text": f"What is in picture {n}?"},
                                             part]}]}


PARTS = [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    {"type": "video_url", "video_url": {"url": "https://example.com/clip.mp4"}},
]


@pytest.mark.parametrize("part", PARTS, ids=["image", "audio", "video"])
async def test_requests_with_media_follow_their_shared_system_prompt(part: dict[str, Any]) -> None:
    replicas = [FakeReplica(name) for name in ("a", "b", "c")]
    bodies = [_asking(n, part) for n in range(5)]
    async with gateway(replicas, policy="prefix") as client:
        answers = [await client.post("/v1/chat/completions", json=body) for body in bodies]
        metrics = (await client.get("/metrics")).text
    assert all(answer.status_code == 200 for answer in answers)
    assert len({answer.headers["x-prefixgate-replica"] for answer in answers}) == 1
    for answer in answers[1:]:
        assert answer.headers["x-prefixgate-reason"] == "hit"
        assert int(answer.headers["x-prefixgate-matched-tokens"]) > 0
    forwarded = [request for replica in replicas for request in replica.requests]
    assert forwarded[-1] == bodies[-1]  # the replica gets the request whole
    assert _sample(metrics, "prefixgate_routing_fallbacks_total", reason="media") == 5


async def test_media_in_the_first_message_is_routed_by_load_and_answered() -> None:
    replica = FakeReplica("a")
    body = {"model": "m", "messages": [{"role": "user", "content": [PARTS[0]]}]}
    async with gateway([replica], policy="prefix") as client:
        answer = await client.post("/v1/chat/completions", json=body)
        metrics = (await client.get("/metrics")).text
    assert answer.status_code == 200
    assert replica.requests[-1] == body
    assert _sample(metrics, "prefixgate_routing_fallbacks_total", reason="media") == 1


def test_routing_reads_the_messages_before_the_first_with_media() -> None:
    text_turn = {"role": "user", "content": [{"type": "text", "text": "hello"}]}
    answer = {"role": "assistant", "content": "hi"}
    body = {"model": "m", "messages": [SYSTEM, text_turn, answer,
                                       _asking(1, PARTS[0])["messages"][1], text_turn]}
    routable = routable_chat(body, 100_000, 100)
    assert routable.media and routable.cut
    assert routable.body["messages"] == [SYSTEM, text_turn, answer]
    plain = routable_chat({"model": "m", "messages": [SYSTEM, text_turn]}, 100_000, 100)
    assert not plain.media and not plain.cut
    with pytest.raises(Unanalysed, match="media"):
        routable_chat({"model": "m", "messages": [_asking(1, PARTS[0])["messages"][1]]},
                      100_000, 100)


def test_the_blocks_routed_are_the_prompts_own_leading_blocks(qwen: HFRenderer) -> None:
    """With the model's tokenizer and template, the blocks routing reads of a request
    with an image are those the same conversation without it starts with: the ones the
    replica caches for the system prompt (all but a last block, which the generation
    prompt may end)."""
    hasher = PromptHasher(qwen)
    media = hasher.describe("m", _asking(1, PARTS[0]), "chat", 16).block_hashes
    plain = hasher.describe("m", {"model": "m", "messages": [
        SYSTEM, {"role": "user", "content": "What is in picture 1?"}]}, "chat", 16).block_hashes
    assert len(media) >= len(qwen.text_token_ids(SYSTEM["content"], False)) // 16 - 1
    assert media[:-1] == plain[:len(media) - 1]


async def test_an_agents_turns_on_the_responses_api_route_together() -> None:
    """Each turn of a task carries the tool calls so far, read as vLLM reads them: every
    turn routes on its whole history, which the replica holds (before, routing read up to
    the first tool call: the same instructions and task each turn)."""
    replicas = [FakeReplica(name) for name in ("a", "b", "c")]
    task = {"role": "user", "content": "Reconcile the March invoices. " * 10}
    calls: list[dict[str, Any]] = []
    answers = []
    async with gateway(replicas, policy="prefix") as client:
        for turn in range(4):
            body = {"model": "m", "instructions": SYSTEM["content"], "input": [task, *calls]}
            answers.append(await client.post("/v1/responses", json=body))
            calls += [{"type": "function_call", "call_id": f"c{turn}", "name": "lookup",
                       "arguments": "{}"},
                      {"type": "function_call_output", "call_id": f"c{turn}",
                       "output": "Invoice lines, amounts and dates. " * 12}]
    assert all(answer.status_code == 200 for answer in answers)
    assert len({answer.headers["x-prefixgate-replica"] for answer in answers}) == 1
    matched = [int(answer.headers["x-prefixgate-matched-tokens"]) for answer in answers]
    assert 0 < matched[1] < matched[2] < matched[3]
