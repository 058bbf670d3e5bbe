"""Claude Code's client against the no-install quick start: Anthropic's official SDK on
``prefixgate serve --embedded sim``, whose replicas serve the Messages API as vLLM 0.32
does (``engine.sim.anthropic_route``; before, a 404 of FastAPI's). The text is the
simulator's; the cache, usage and events are what a user of a real fleet would see."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.gateway import QUICK_START, GatewayProcess, running_gateway

MODEL = "sim-model"
SYSTEM = "You are the support assistant of ACME. Cite the policy; never invent orders. " * 12
TOOLS = [{"name": "lookup", "description": "Find an order by its number.",
          "input_schema": {"type": "object", "properties": {"order": {"type": "string"}},
                           "required": ["order"]}}]


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    with running_gateway(QUICK_START) as gw:
        yield gw


@pytest.fixture(scope="module")
def claude(gateway: GatewayProcess) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def sdk(claude: anthropic.Anthropic) -> anthropic.Anthropic:
    return claude


def test_a_follow_up_reads_its_system_prompt_from_the_replicas_cache(
        claude: anthropic.Anthropic) -> None:
    first = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=8, system=SYSTEM,
        messages=[{"role": "user", "content": "Where is my order?"}])
    answer = first.parse()
    assert answer.type == "message" and answer.role == "assistant"
    assert answer.content[0].type == "text" and answer.stop_reason == "max_tokens"
    assert answer.usage.output_tokens == 8
    written = answer.usage.cache_creation_input_tokens  # a new prompt: its full blocks
    assert answer.usage.cache_read_input_tokens == 0 and written is not None and written >= 128
    billed = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1; cch=9f3e1;"},
              {"type": "text", "text": SYSTEM}]  # Claude Code's per-request block, left out
    again = claude.messages.with_raw_response.create(
        model=MODEL, max_tokens=8, system=billed,  # type: ignore[arg-type]
        messages=[{"role": "user", "content": "And my refund?"}])
    usage = again.parse().usage
    assert again.headers["x-prefixgate-replica"] == first.headers["x-prefixgate-replica"]
    matched = int(again.headers["x-prefixgate-matched-tokens"])
    assert matched >= 128 and usage.cache_read_input_tokens == matched
    assert usage.cache_read_input_tokens is not None
    total = (usage.input_tokens + usage.cache_read_input_tokens
             + (usage.cache_creation_input_tokens or 0))
    counted = claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=[
        {"role": "user", "content": "And my refund?"}])
    assert counted.input_tokens == total
    first_total = claude.messages.count_tokens(model=MODEL, system=SYSTEM, messages=[
        {"role": "user", "content": "Where is my order?"}]).input_tokens
    assert answer.usage.input_tokens + written == first_total


def test_a_stream_is_anthropics_events_with_usage_at_its_end(
        claude: anthropic.Anthropic, gateway: GatewayProcess) -> None:
    with claude.messages.stream(model=MODEL, max_tokens=6, system=SYSTEM,
                                messages=[{"role": "user", "content": "Hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text and final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 6
    with httpx.stream("POST", gateway.url + "/v1/messages", timeout=60, json={
            "model": MODEL, "max_tokens": 3, "stream": True,
            "messages": [{"role": "user", "content": "Hi"}]}) as raw:
        events = [line[7:] for line in raw.iter_lines() if line.startswith("event: ")]
    assert events == ["message_start", "content_block_start", "content_block_delta",
                      "content_block_delta", "content_block_delta", "content_block_stop",
                      "message_delta", "message_stop"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_use_and_its_result_make_an_agents_next_turn(sdk: anthropic.Anthropic,
                                                            stream: bool) -> None:
    claude: Any = sdk  # the bodies below are built as dicts, as an agent's loop builds them
    ask: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "system": SYSTEM, "tools": TOOLS,
           "messages": [{"role": "user", "content": "Where is order A-1?"}]}
    if stream:
        with claude.messages.stream(**ask, tool_choice={"type": "tool",
                                                         "name": "lookup"}) as events:
            call = events.get_final_message()
    else:
        call = claude.messages.create(**ask, tool_choice={"type": "any"})
    assert call.stop_reason == "tool_use"
    (use,) = [block for block in call.content if block.type == "tool_use"]
    assert use.name == "lookup" and isinstance(use.input["order"], str)
    turn = claude.messages.with_raw_response.create(**{**ask, "messages": [
        *ask["messages"], {"role": "assistant", "content": [b.model_dump() for b in call.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "shipped on Monday"}]}]})
    assert turn.status_code == 200 and turn.parse().usage.cache_read_input_tokens >= 128


def test_errors_are_anthropics_and_the_sdk_raises_them(claude: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as unknown:
        claude.messages.create(model="nope", max_tokens=4,
                               messages=[{"role": "user", "content": "hi"}])
    assert unknown.value.body["type"] == "error"  # type: ignore[index]
    with pytest.raises(anthropic.BadRequestError) as too_long:  # the replica's own refusal
        claude.messages.create(model=MODEL, max_tokens=5_000,
                               messages=[{"role": "user", "content": "hi"}])
    assert too_long.value.body["error"]["type"] == "BadRequestError"  # type: ignore[index]


def test_a_batch_of_chats_answers_one_choice_per_conversation(gateway: GatewayProcess) -> None:
    answer = httpx.post(gateway.url + "/v1/chat/completions/batch", timeout=60, json={
        "model": MODEL, "max_tokens": 3, "messages": [
            [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "One?"}],
            [{"role": "user", "content": "Two?"}]]})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert [choice["index"] for choice in body["choices"]] == [0, 1]
    assert body["usage"]["completion_tokens"] == 6
