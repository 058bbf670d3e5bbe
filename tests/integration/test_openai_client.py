"""The official openai client, sync and async, cannot tell the gateway from vLLM."""

from __future__ import annotations

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.support.gateway import GatewayProcess

from .conftest import MODEL

CHAT: list[ChatCompletionMessageParam] = [{"role": "system", "content": "You are terse."},
                                          {"role": "user", "content": "Say something."}]


@pytest.fixture()
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture()
def aclient(gateway: GatewayProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=CHAT, seed=1)
    reply = raw.parse()
    assert raw.headers["x-prefixgate-replica"] in {"s0", "s1"}
    assert raw.headers["x-request-id"]
    assert reply.object == "chat.completion"
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.usage and reply.usage.prompt_tokens > 0 and reply.usage.completion_tokens > 0


def test_chat_streaming_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(model=MODEL, messages=CHAT, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_n_and_length_limit(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(model=MODEL, messages=CHAT, n=2, max_tokens=3,
                                           extra_body={"ignore_eos": True})
    assert [c.index for c in reply.choices] == [0, 1]
    assert all(c.finish_reason == "length" for c in reply.choices)
    assert reply.usage is not None and reply.usage.completion_tokens == 6


def test_legacy_completions(client: openai.OpenAI) -> None:
    reply = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5)
    assert reply.object == "text_completion" and reply.choices[0].text
    streamed = list(client.completions.create(model=MODEL, prompt="Once upon", max_tokens=5,
                                              stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices)


def test_models_list(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_same_seed_same_answer_through_gateway(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=CHAT, seed=42)
    second = client.chat.completions.create(model=MODEL, messages=CHAT, seed=42)
    assert first.choices[0].message.content == second.choices[0].message.content


async def test_async_client_streaming_and_not(aclient: openai.AsyncOpenAI) -> None:
    reply = await aclient.chat.completions.create(model=MODEL, messages=CHAT)
    assert reply.choices[0].message.content
    stream = await aclient.chat.completions.create(model=MODEL, messages=CHAT, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text


async def test_async_unknown_model(aclient: openai.AsyncOpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        await aclient.chat.completions.create(model="no-such-model", messages=CHAT)
    assert info.value.status_code == 404


def test_errors_map_to_client_exceptions(client: openai.OpenAI, gateway: GatewayProcess) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-nope", messages=CHAT)
    with pytest.raises(openai.BadRequestError) as bad:  # the replica's answer, as vLLM's
        client.chat.completions.create(model=MODEL, messages=[])
    assert "x-prefixgate-replica" in bad.value.response.headers
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=CHAT, n=0)
    with pytest.raises(openai.APIStatusError) as big:
        client.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": "x" * 300_000}])
    assert big.value.status_code == 413
    response = httpx.post(gateway.url + "/v1/chat/completions", content=b"{oops",
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["type"] == "BadRequestError"


def test_replica_validation_error_passes_through(client: openai.OpenAI) -> None:
    # The replica (not the gateway) rejects a prompt over its max_model_len.
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=[
            {"role": "user", "content": "word " * 20000}])
    assert "x-prefixgate-replica" in info.value.response.headers
