"""vLLM's Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) through
the gateway: relayed as vLLM serves it, and routed on the chat request vLLM renders it as."""

from __future__ import annotations

from typing import Any

from gateway.request.prompt_shapes import prompt_of

from .fake_replica import FakeReplica
from .test_gateway_core import gateway
from .test_hostile_requests import _sample

SYSTEM = "You are a coding agent working in the user's repository. Follow the rules. " * 20
TOOLS = [{"name": "read_file", "description": "Read a file.",
          "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}}]


def test_a_messages_body_renders_as_the_chat_request_vllm_makes_of_it() -> None:
    body = {"model": "m", "max_tokens": 64, "tools": TOOLS,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cc=1.2; h=9f3e"},
                       {"type": "text", "text": "Rules. "}, {"type": "text", "text": "More."}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "Fix the bug."}]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "read_file", "input": {"path": "a"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": "..."}]}]}
    assert prompt_of("messages", body) == ("chat", {
        "messages": [{"role": "system", "content": "Rules. More."},
                     {"role": "user", "content": "Fix the bug."}],
        "tools": [{"type": "function", "function": {
            "name": "read_file", "description": "Read a file.",
            "parameters": TOOLS[0]["input_schema"]}}]})
    assert prompt_of("messages", {"system": "S", "messages": [
        {"role": "user", "content": "Hi"}]}) == ("chat", {"messages": [
            {"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]})
    assert prompt_of("messages", {"messages": []}) is None
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    assert prompt_of("messages", {"system": "S", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, image]}]}) == ("chat", {"messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]})


def _turn(calls: int) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Find the failing test."}]
    for n in range(calls):
        messages += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{n}",
                                               "name": "read_file", "input": {"path": f"f{n}"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{n}",
                                          "content": "contents"}]}]
    return {"model": "m", "max_tokens": 64, "system": SYSTEM, "tools": TOOLS,
            "messages": messages}


async def test_an_agents_turns_route_together_and_count_tokens_is_relayed() -> None:
    replicas = [FakeReplica(name) for name in ("a", "b", "c")]
    async with gateway(replicas, policy="prefix") as client:
        answers = [await client.post("/v1/messages", json=_turn(calls)) for calls in range(4)]
        counted = await client.post("/v1/messages/count_tokens",
                                    json={"model": "m", "messages": _turn(0)["messages"]})
        streamed = await client.post("/v1/messages", json={**_turn(1), "stream": True})
    assert all(answer.status_code == 200 for answer in answers)
    assert len({answer.headers["x-prefixgate-replica"] for answer in answers}) == 1
    assert all(answer.headers["x-prefixgate-reason"] == "hit" for answer in answers[1:])
    assert all(int(answer.headers["x-prefixgate-matched-tokens"]) > 0 for answer in answers[1:])
    assert counted.status_code == 200
    assert streamed.status_code == 200 and streamed.text.endswith("data: [DONE]\n\n")
    assert streamed.headers["x-prefixgate-replica"] == answers[0].headers["x-prefixgate-replica"]
    forwarded = [request for replica in replicas for request in replica.requests]
    assert forwarded[3] == _turn(3)  # the replica gets each request as sent


async def test_messages_with_images_follow_their_system_prompt_counted_as_media() -> None:
    replicas = [FakeReplica(name) for name in ("a", "b", "c")]
    bodies = [{"model": "m", "max_tokens": 8, "system": SYSTEM, "messages": [
        {"role": "user", "content": [
            {"type": "text", "text": f"What is in picture {n}?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": f"{n}AAAA"}}]}]} for n in range(3)]
    async with gateway(replicas, policy="prefix") as client:
        answers = [await client.post("/v1/messages", json=body) for body in bodies]
        metrics = (await client.get("/metrics")).text
    assert len({answer.headers["x-prefixgate-replica"] for answer in answers}) == 1
    assert all(int(answer.headers["x-prefixgate-matched-tokens"]) > 0 for answer in answers[1:])
    assert _sample(metrics, "prefixgate_routing_fallbacks_total", reason="media") == 3
