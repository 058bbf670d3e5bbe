"""Apps that need structured output, run on the no-install quick start.

``prefixgate serve --embedded sim`` (the real gateway, its two simulated
replicas with the real Qwen3 tokenizer) driven by the official ``openai``
client and by the frameworks people build on it: tool calls, JSON valid
against a pydantic model's schema, logprobs, ``echo`` with no new tokens.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from pydantic import BaseModel, Field

from tests.support.gateway import GatewayProcess

MODEL = "sim-model"


class City(BaseModel):
    name: str
    country: str
    population: int = Field(ge=0)
    coastal: bool
    climate: Literal["arid", "temperate", "tropical", "polar"]
    landmarks: list[str] = Field(min_length=1, max_length=4)
    mayor: str | None = None


WEATHER_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"},
                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {"name": "get_time", "description": "The time in a timezone.",
                 "parameters": {"type": "object",
                                "properties": {"tz": {"type": "string"}}, "required": ["tz"]}},
}


@pytest.fixture(scope="module")
def gateway() -> Iterator[GatewayProcess]:
    gw = GatewayProcess({"embedded": {"kind": "sim", "replicas": 2, "time_scale": 50},
                         "policy": "least_load", "health_interval": 0.2})
    try:
        yield gw.start(timeout=120)
    finally:
        gw.stop()


@pytest.fixture(scope="module")
def client(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0) as api:
        yield api


def ask(content: str) -> list[ChatCompletionMessageParam]:
    return [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": content}]


# -- structured output ------------------------------------------------------------


def test_parse_with_a_pydantic_model_returns_a_valid_instance(client: openai.OpenAI) -> None:
    completion = client.chat.completions.parse(
        model=MODEL, messages=ask("Describe a city."), response_format=City, max_tokens=400)
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(message.parsed, City) and message.parsed.landmarks
    assert City.model_validate_json(message.content or "") == message.parsed


def test_json_schema_output_is_valid_for_any_seed(client: openai.OpenAI) -> None:
    schema = City.model_json_schema()
    for seed in range(4):
        reply = client.chat.completions.create(
            model=MODEL, messages=ask("a city"), seed=seed, max_tokens=400,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "city", "schema": schema}})
        jsonschema.validate(json.loads(reply.choices[0].message.content or ""), schema)


def test_json_object_is_a_json_object(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=ask("answer in JSON"), max_tokens=200,
        response_format={"type": "json_object"})
    assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)


def test_the_same_seed_gives_the_same_json(client: openai.OpenAI) -> None:
    def once() -> str | None:
        return client.chat.completions.create(
            model=MODEL, messages=ask("a city"), seed=11, max_tokens=400,
            response_format={"type": "json_schema", "json_schema": {
                "name": "city", "schema": City.model_json_schema()}}).choices[0].message.content

    assert once() == once()


def test_streamed_json_joins_into_the_schema(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=ask("a city"), max_tokens=400, stream=True,
        response_format={"type": "json_schema", "json_schema": {
            "name": "city", "schema": City.model_json_schema()}})
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    City.model_validate_json(text)


# -- tool calls -----------------------------------------------------------------------


def _arguments_valid(call: Any, tool: ChatCompletionFunctionToolParam) -> dict[str, Any]:
    arguments = json.loads(call.function.arguments)
    jsonschema.validate(arguments, tool["function"]["parameters"])
    return arguments


@pytest.mark.parametrize(("tool_choice", "finish"), [
    ("auto", "tool_calls"), ("required", "tool_calls"),
    ({"type": "function", "function": {"name": "get_weather"}}, "stop")])
def test_tool_choice_gives_a_call_with_valid_arguments(
        client: openai.OpenAI, tool_choice: Any, finish: str) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=ask("What is the weather in Lyon?"), max_tokens=200,
        tools=[TIME_TOOL, WEATHER_TOOL], tool_choice=tool_choice)
    choice = reply.choices[0]
    assert choice.finish_reason == finish  # as vLLM: "stop" for a named tool
    (call,) = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("chatcmpl-tool-")
    assert call.function.name == "get_weather"  # named, or mentioned by the user
    _arguments_valid(call, WEATHER_TOOL)


def test_after_the_tool_result_auto_answers_in_text(client: openai.OpenAI) -> None:
    messages = ask("What is the weather in Lyon?") + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'}]
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=30,
                                           tools=[WEATHER_TOOL])
    choice = reply.choices[0]
    assert choice.message.tool_calls is None and choice.message.content
    assert choice.finish_reason in ("stop", "length")


@pytest.mark.parametrize("tool_choice", ["auto", "required", {
    "type": "function", "function": {"name": "get_weather"}}])
def test_streamed_tool_calls_assemble_like_vllms(client: openai.OpenAI, tool_choice: Any) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=ask("weather in Oslo?"), max_tokens=200, stream=True,
        tools=[WEATHER_TOOL], tool_choice=tool_choice)
    name, arguments, ids, finish = "", "", set(), None
    for chunk in stream:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or []:
                assert delta.index == 0
                ids |= {delta.id} if delta.id else set()
                name += delta.function.name or "" if delta.function else ""
                arguments += delta.function.arguments or "" if delta.function else ""
            finish = choice.finish_reason or finish
    assert name == "get_weather" and len(ids) == 1
    jsonschema.validate(json.loads(arguments), WEATHER_TOOL["function"]["parameters"])
    assert finish == ("stop" if isinstance(tool_choice, dict) else "tool_calls")


def test_tool_choice_errors_are_vllms(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(
            model=MODEL, messages=ask("x"), tools=[WEATHER_TOOL],
            tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "does not match any of the specified `tools`" in unknown.value.message
    with pytest.raises(openai.BadRequestError) as without:
        client.chat.completions.create(model=MODEL, messages=ask("x"), tool_choice="required")
    assert "`tools` must be set" in without.value.message


# -- logprobs and echo ------------------------------------------------------------------


def test_streamed_chat_logprobs_match_the_tokens(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, messages=ask("hi"), max_tokens=6, stream=True, logprobs=True,
        top_logprobs=3, extra_body={"ignore_eos": True})
    content, tokens = "", []
    for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for entry in (choice.logprobs.content or []) if choice.logprobs else []:
                assert len(entry.top_logprobs) == 3 and entry.top_logprobs[0].token == entry.token
                tokens.append(entry.token)
    assert len(tokens) == 6 and "".join(tokens) == content


def test_completion_logprobs_and_an_echo_without_new_tokens(client: openai.OpenAI) -> None:
    scored = client.completions.create(model=MODEL, prompt="The capital of France is",
                                       max_tokens=0, echo=True, logprobs=1)
    choice = scored.choices[0]
    assert choice.text == "The capital of France is"  # the prompt alone
    assert choice.logprobs is not None and choice.logprobs.token_logprobs is not None
    assert choice.logprobs.token_logprobs[0] is None  # the first token has no context
    assert all(lp is not None and lp <= 0 for lp in choice.logprobs.token_logprobs[1:])
    assert "".join(choice.logprobs.tokens or []) == choice.text
    assert scored.usage is not None and scored.usage.prompt_tokens == len(
        choice.logprobs.tokens or [])
    generated = client.completions.create(model=MODEL, prompt="Once upon", max_tokens=4,
                                          logprobs=2, extra_body={"ignore_eos": True})
    logprobs = generated.choices[0].logprobs
    assert logprobs is not None and len(logprobs.tokens or []) == 4
    assert all(len(top) == 2 for top in logprobs.top_logprobs or [])


def test_max_tokens_zero_without_echo_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="x", max_tokens=0)


def test_n_choices_each_get_their_own_valid_call(gateway: GatewayProcess) -> None:
    body = {"model": MODEL, "messages": ask("weather?"), "n": 3, "tools": [WEATHER_TOOL],
            "tool_choice": "required", "max_tokens": 200}
    reply = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=30).json()
    assert [choice["index"] for choice in reply["choices"]] == [0, 1, 2]
    for choice in reply["choices"]:
        (call,) = choice["message"]["tool_calls"]
        jsonschema.validate(json.loads(call["function"]["arguments"]),
                            WEATHER_TOOL["function"]["parameters"])
