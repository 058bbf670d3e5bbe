"""vLLM's Anthropic Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) through
the gateway: relayed as vLLM serves it, and routed on the chat request vLLM renders it as."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import pytest

from gateway.request.prompt_shapes import prompt_of
from tests.support.api_keys import write_keys

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
                     {"role": "user", "content": "Fix the bug."},
                     {"role": "assistant", "tool_calls": [{"id": "t1", "type": "function",
                                                           "function": {
                         "name": "read_file", "arguments": '{"path": "a"}'}}]},
                     {"role": "tool", "tool_call_id": "t1", "content": "..."}],
        "tools": [{"type": "function", "function": {
            "name": "read_file", "description": "Read a file.",
            "parameters": TOOLS[0]["input_schema"], "strict": None,
            "defer_loading": None}}]})  # vLLM's fields; the renderer drops unset ones
    # A tool result next to text: the tool message first, then the user's text (as vLLM);
    # thinking is the assistant's reasoning, which the template is handed.
    assert prompt_of("messages", {"messages": [
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {"type": "text", "text": "Go on."}]},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]}]}) == (
        "chat", {"messages": [{"role": "tool", "tool_call_id": "t1", "content": "a\nb"},
                              {"role": "user", "content": "Go on."},
                              {"role": "assistant", "reasoning": "hm"}]})
    assert prompt_of("messages", {"system": "S", "messages": [
        {"role": "user", "content": "Hi"}]}) == ("chat", {"messages": [
            {"role": "system", "content": "S"}, {"role": "user", "content": "Hi"}]})
    assert prompt_of("messages", {"messages": []}) is None
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA"}}
    assert prompt_of("messages", {"system": "S", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, image]}]}) == ("chat", {"messages": [
            {"role": "system", "content": "S"},
            {"role": "user", "content": [{"type": "text", "text": "What is this?"}, {
                "type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]})


def sdk(client: httpx.AsyncClient, key: str = "x") -> anthropic.AsyncAnthropic:
    """Anthropic's official SDK against the gateway app in this process (the SDK brings
    its own HTTP package, httpx2)."""
    transport = httpx2.ASGITransport(app=client.app)  # type: ignore[attr-defined]
    return anthropic.AsyncAnthropic(base_url="http://gw", api_key=key, max_retries=0,
                                    http_client=httpx2.AsyncClient(transport=transport))


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
    matched = [int(answer.headers["x-prefixgate-matched-tokens"]) for answer in answers]
    assert 0 < matched[1] < matched[2] < matched[3]  # each turn's whole history, tool calls
    # and results included (before, routing read up to the first tool use: all equal)
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


async def test_the_gateways_own_errors_on_the_messages_api_are_anthropic_shaped() -> None:
    """An unknown model, a missing key, a replica that dies mid-stream: Anthropic's shape
    on its routes (the official SDK raises with the message; a stream's error is the
    ``error`` event it reads, not an unnamed one it would skip), OpenAI's elsewhere and
    for a body that is not JSON (vLLM's request validation answers that in OpenAI's)."""
    replica = FakeReplica("a", chunks=4, break_stream_after=2)
    async with gateway([replica], policy="prefix") as client:
        unknown = await client.post("/v1/messages", json={**_turn(0), "model": "nope"})
        counted = await client.post("/v1/messages/count_tokens",
                                    json={"model": "nope", "messages": _turn(0)["messages"]})
        chat = await client.post("/v1/chat/completions", json={
            "model": "nope", "messages": [{"role": "user", "content": "hi"}]})
        unreadable = await client.post("/v1/messages", content=b"{not json",
                                       headers={"content-type": "application/json"})
        broken = await client.post("/v1/messages", json={**_turn(0), "stream": True})
        with pytest.raises(anthropic.NotFoundError) as raised:
            await sdk(client).messages.create(**{**_turn(0), "model": "nope"})
    for answer in (unknown, counted):
        assert answer.status_code == 404
        assert answer.json() == {"type": "error", "error": {
            "type": "NotFoundError", "message": unknown.json()["error"]["message"]}}
    assert "nope" in unknown.json()["error"]["message"]
    assert "nope" in raised.value.message
    assert set(chat.json()["error"]) == {"message", "type", "param", "code"}
    assert unreadable.status_code == 400 and set(unreadable.json()["error"]) == {
        "message", "type", "param", "code"}
    assert broken.status_code == 200
    *_, last = broken.text.rstrip("\n").split("\n\n")
    event, data = last.split("\n")
    assert event == "event: error"
    error = json.loads(data.removeprefix("data: "))
    assert error["type"] == "error" and "mid-stream" in error["error"]["message"]


async def test_gateway_refusals_before_routing_are_anthropic_shaped_on_its_routes(
        tmp_path: Path) -> None:
    """A missing key: Anthropic's error on /v1/messages (the SDK raises
    AuthenticationError with the gateway's message), OpenAI's on chat."""
    keys = write_keys(tmp_path / "keys.yaml", [{"key": "sk-alpha-0001", "tenant": "alpha"}])
    replica = FakeReplica("a")
    async with gateway([replica], api_keys=keys, tenant_salt_secret="s") as client:
        refused = await client.post("/v1/messages", json=_turn(0))
        chat = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}]})
        with pytest.raises(anthropic.AuthenticationError):
            await sdk(client, "sk-wrong").messages.create(**_turn(0))
        answer = await sdk(client, "sk-alpha-0001").messages.with_raw_response.create(**_turn(0))
    assert refused.status_code == 401 and refused.json()["type"] == "error"
    assert refused.json()["error"]["type"] == "AuthenticationError"
    assert chat.status_code == 401 and "param" in chat.json()["error"]
    assert answer.status_code == 200  # x-api-key, as the SDK sends it
