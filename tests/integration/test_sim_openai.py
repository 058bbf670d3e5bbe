"""The simulated replica as the official ``openai`` client sees it (real subprocess)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionMessageParam

from tests.support.sim import SimProcess, running_sim

LONG_SYSTEM = "You are a meticulous assistant. " * 40  # ~1300 tokens with the byte tokenizer


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with running_sim(
        "--time-scale", "50", "--served-model-name", "sim-a", "--max-model-len", "4096"
    ) as process:
        yield process


@pytest.fixture(scope="module")
def client(sim: SimProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=sim.v1_url, api_key="unused", max_retries=0) as api:
        yield api


def cached_tokens(response: ChatCompletion) -> int:
    assert response.usage is not None and response.usage.prompt_tokens_details is not None
    assert response.usage.prompt_tokens_details.cached_tokens is not None
    return response.usage.prompt_tokens_details.cached_tokens


def chat(content: str, system: str = "Be brief.") -> list[ChatCompletionMessageParam]:
    return [{"role": "system", "content": system}, {"role": "user", "content": content}]


def test_models_lists_the_served_name(client: openai.OpenAI) -> None:
    models = client.models.list()
    assert [model.id for model in models.data] == ["sim-a"]
    card = models.data[0].model_dump()
    assert card["owned_by"] == "vllm" and card["max_model_len"] == 4096 and card["root"] == "sim-a"


def test_chat_completion_is_shaped_like_vllm(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(model="sim-a", messages=chat("hello"), max_tokens=5)
    assert response.id.startswith("chatcmpl-") and response.object == "chat.completion"
    choice = response.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert response.usage is not None and response.usage.completion_tokens <= 5
    assert (
        response.usage.total_tokens
        == response.usage.prompt_tokens + response.usage.completion_tokens
    )
    raw = choice.model_dump()
    # vLLM 0.32 leaves an empty tool_calls out of the message (tests/fixtures/vllm)
    assert raw["stop_reason"] is None and raw["message"]["tool_calls"] is None


def test_max_tokens_reached_finishes_with_length(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="sim-a",
        messages=chat("count"),
        max_completion_tokens=3,
        extra_body={"ignore_eos": True},
    )
    assert response.choices[0].finish_reason == "length"
    assert response.usage is not None and response.usage.completion_tokens == 3
    assert len((response.choices[0].message.content or "").split()) == 3


def test_same_seed_same_answer(client: openai.OpenAI) -> None:
    def ask() -> str | None:
        reply = client.chat.completions.create(
            model="sim-a", messages=chat("seeded"), seed=7, max_tokens=20
        )
        return reply.choices[0].message.content

    assert ask() == ask()


def test_n_2_returns_two_different_choices(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="sim-a",
        messages=chat("two please"),
        n=2,
        max_tokens=12,
        extra_body={"ignore_eos": True},
    )
    assert [choice.index for choice in response.choices] == [0, 1]
    assert response.choices[0].message.content != response.choices[1].message.content
    assert response.usage is not None and response.usage.completion_tokens == 24


def test_streaming_with_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="sim-a",
        messages=chat("stream it"),
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert (
        chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    finishing = [chunk for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].choices[0].finish_reason == "length"
    assert len(text.split()) == 6
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and last.usage.completion_tokens == 6
    assert all(
        chunk.object == "chat.completion.chunk" and chunk.id == chunks[0].id for chunk in chunks
    )


def test_streaming_n_2_and_continuous_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="sim-a",
        messages=chat("both"),
        n=2,
        max_tokens=4,
        stream=True,
        extra_body={
            "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    )
    chunks = [chunk for chunk in stream if chunk.choices]
    finished = {chunk.choices[0].index for chunk in chunks if chunk.choices[0].finish_reason}
    assert finished == {0, 1}
    assert all(chunk.usage is not None for chunk in chunks)
    assert max(chunk.usage.completion_tokens for chunk in chunks if chunk.usage) == 4


def test_stop_string_ends_the_answer_without_sending_it(client: openai.OpenAI) -> None:
    full = client.chat.completions.create(
        model="sim-a",
        messages=chat("stop test"),
        seed=3,
        max_tokens=30,
        extra_body={"ignore_eos": True},
    )
    words = (full.choices[0].message.content or "").split()
    stop = " ".join(words[4:6])
    cut = client.chat.completions.create(
        model="sim-a",
        messages=chat("stop test"),
        seed=3,
        max_tokens=30,
        stop=[stop],
        stream=True,
        extra_body={"ignore_eos": True},
    )
    chunks = [chunk for chunk in cut if chunk.choices]
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert stop not in text and text == (full.choices[0].message.content or "")[: len(text)]
    assert chunks[-1].choices[0].finish_reason == "stop"
    assert chunks[-1].choices[0].model_dump()["stop_reason"] == stop


def test_a_repeated_long_prompt_reports_cached_tokens(client: openai.OpenAI) -> None:
    messages = chat("what is cached?", system=LONG_SYSTEM + "cache-test")
    first = client.chat.completions.create(model="sim-a", messages=messages, max_tokens=2)
    second = client.chat.completions.create(model="sim-a", messages=messages, max_tokens=2)
    assert cached_tokens(first) == 0
    assert second.usage is not None
    assert cached_tokens(second) == (second.usage.prompt_tokens - 1) // 16 * 16


def test_cache_salt_isolates_the_cache(client: openai.OpenAI) -> None:
    messages = chat("salted", system=LONG_SYSTEM + "salt-test")
    client.chat.completions.create(
        model="sim-a", messages=messages, max_tokens=1, extra_body={"cache_salt": "a"}
    )
    other = client.chat.completions.create(
        model="sim-a", messages=messages, max_tokens=1, extra_body={"cache_salt": "b"}
    )
    same = client.chat.completions.create(
        model="sim-a", messages=messages, max_tokens=1, extra_body={"cache_salt": "a"}
    )
    assert cached_tokens(other) == 0
    assert cached_tokens(same) > 0


def test_completions_accept_every_prompt_form(client: openai.OpenAI) -> None:
    single = client.completions.create(model="sim-a", prompt="Once upon a time", max_tokens=4)
    assert single.id.startswith("cmpl-") and single.object == "text_completion"
    several = client.completions.create(model="sim-a", prompt=["a b", "c d"], max_tokens=3, n=2)
    assert [choice.index for choice in several.choices] == [0, 1, 2, 3]
    tokens = client.completions.create(model="sim-a", prompt=[72, 105, 33], max_tokens=2)
    assert tokens.usage is not None and tokens.usage.prompt_tokens == 3
    batches = client.completions.create(
        model="sim-a", prompt=[[72, 105], [33, 33, 33]], max_tokens=2
    )
    assert (
        batches.usage is not None and batches.usage.prompt_tokens == 5 and len(batches.choices) == 2
    )
    stream = client.completions.create(
        model="sim-a",
        prompt="stream",
        max_tokens=3,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    chunks = list(stream)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 3
    assert [chunk.choices[0].finish_reason for chunk in chunks[:-1]][-1] == "length"


def test_unknown_fields_are_accepted(client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="sim-a",
        messages=chat("x"),
        max_tokens=2,
        extra_body={"whatever": {"a": 1}, "ignore_eos": True},
    )
    assert response.choices[0].message.content
    assert response.usage is not None and response.usage.completion_tokens == 2


def test_logprobs_come_back_one_per_token_with_the_top_alternatives(
        client: openai.OpenAI) -> None:
    response = client.chat.completions.create(
        model="sim-a",
        messages=chat("x"),
        max_tokens=3,
        logprobs=True,
        top_logprobs=2,
        extra_body={"ignore_eos": True},
    )
    choice = response.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    entries = choice.logprobs.content
    assert response.usage is not None
    assert len(entries) == response.usage.completion_tokens == 3
    for entry in entries:
        assert entry.token and entry.logprob <= 0.0  # a log-probability
        assert len(entry.top_logprobs) == 2
        first, second = entry.top_logprobs
        assert 0.0 >= first.logprob >= second.logprob  # most likely first


def test_errors_are_openai_shaped(client: openai.OpenAI, sim: SimProcess) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=chat("x"))
    assert missing.value.body == {
        "message": "The model `nope` does not exist. Valid aliases: sim-a.",
        "type": "NotFoundError",
        "param": "model",
        "code": 404,
    }
    with pytest.raises(openai.BadRequestError) as too_long:
        client.chat.completions.create(model="sim-a", messages=chat("x" * 5000))
    assert "maximum context length is 4096 tokens" in too_long.value.message
    raw = httpx.post(
        f"{sim.v1_url}/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
    )
    assert raw.status_code == 400
    error = raw.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == 400
    missing_messages = httpx.post(f"{sim.v1_url}/chat/completions", json={"model": "sim-a"})
    assert (
        missing_messages.status_code == 400
        and missing_messages.json()["error"]["param"] == "body.messages"
    )


async def test_the_async_client_streams_concurrently(sim: SimProcess) -> None:
    async with openai.AsyncOpenAI(base_url=sim.v1_url, api_key="unused", max_retries=0) as api:

        async def one(i: int) -> str:
            stream = await api.chat.completions.create(
                model="sim-a",
                messages=chat(f"async {i}"),
                max_tokens=5,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            return "".join(
                [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
            )

        texts = await asyncio.gather(*(one(i) for i in range(8)))
    assert all(len(text.split()) == 5 for text in texts)


def test_health_version_and_peer_router_probes(sim: SimProcess) -> None:
    with httpx.Client(base_url=sim.base_url) as http:
        health = http.get("/health")
        assert health.status_code == 200 and health.content == b""
        assert http.get("/version").json()["version"]
        for path in ("/server_info", "/get_server_info"):
            info = http.get(path).json()
            assert info["served_model_name"] == "sim-a" and info["block_size"] == 16
        for path in ("/model_info", "/get_model_info"):
            assert http.get(path).json()["model_path"] == "sim-a"


def test_the_timing_log_brackets_a_streamed_request(client: openai.OpenAI, sim: SimProcess) -> None:
    before = time.perf_counter()
    stream = client.chat.completions.create(
        model="sim-a", messages=chat("time me"), max_tokens=3, stream=True,
        extra_headers={"x-request-id": "timed-1"})
    first = None
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter()
    assert first is not None
    client.chat.completions.create(model="sim-a", messages=chat("untimed"), max_tokens=1)
    with httpx.Client(base_url=sim.base_url) as http:
        log = http.get("/sim/timings", params={"prefix": "timed-"}).json()["requests"]
    # One clock across processes: the replica got the request after it was
    # sent and had its first token before the client read it.
    assert [entry["id"] for entry in log] == ["timed-1"]
    assert before < log[0]["received"] < log[0]["first_token"] < first


def test_a_replica_can_be_stopped_and_restarted_on_the_same_port() -> None:
    with running_sim("--time-scale", "50") as replica:
        port = replica.port
        replica.stop()
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{replica.base_url}/health")
        replica.start()
        assert replica.port == port
        assert httpx.get(f"{replica.base_url}/health").status_code == 200
