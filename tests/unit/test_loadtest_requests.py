"""The load generator sends each conversation kind as its workload says (fake server).

Request bodies are checked where they leave the official ``openai`` client:
completions go to ``/v1/completions`` with a ``prompt`` and their text is
read from ``choices[0].text``; a flattened conversation's next message holds
the answer that was streamed back; an agent loop sends its tools and drops
the answers. The same shapes against the real simulator are in
``tests/integration/test_loadtest_workload_kinds.py``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai

from loadtest.client import OpenAIClient
from loadtest.driver import drive
from loadtest.workloads.agent_tools import TOOLS
from loadtest.workloads.registry import build_workload


class _Server:
    """Streams ``ANSWER<n> more`` back and records every request (path, body)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any]]] = []

    def client(self) -> OpenAIClient:
        http = httpx.AsyncClient(transport=httpx.MockTransport(self.handle))
        return OpenAIClient(openai.AsyncOpenAI(base_url="http://fake/v1", api_key="x",
                                               max_retries=0, http_client=http))  # type: ignore[arg-type]

    async def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append((request.url.path, body))
        completions = request.url.path == "/v1/completions"
        return httpx.Response(200, headers={"content-type": "text/event-stream",
                                            "x-prefixgate-replica": "r0"},
                              stream=_Stream(completions, len(self.requests)))


class _Stream(httpx.AsyncByteStream):
    def __init__(self, completions: bool, number: int) -> None:
        self.completions, self.number = completions, number

    async def __aiter__(self) -> AsyncIterator[bytes]:
        kind = "text_completion" if self.completions else "chat.completion.chunk"
        for piece in (f"ANSWER{self.number}", " more"):
            choice = ({"index": 0, "text": piece, "finish_reason": None} if self.completions
                      else {"index": 0, "delta": {"content": piece}, "finish_reason": None})
            yield _sse({"id": "x", "object": kind, "created": 0, "model": "m",
                        "choices": [choice]})
        yield _sse({"id": "x", "object": kind, "created": 0, "model": "m", "choices": [],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 2, "total_tokens": 13,
                              "prompt_tokens_details": {"cached_tokens": 3}}})
        yield b"data: [DONE]\n\n"


def _sse(chunk: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def _drive(name: str, params: dict[str, Any]) -> tuple[_Server, Any]:
    server = _Server()
    client = server.client()
    result = await drive(build_workload(name, params), client, "m",
                         clock=itertools.count().__next__)
    await client.close()
    return server, result


async def test_completions_go_to_v1_completions_with_a_prompt() -> None:
    server, result = await _drive("shared-prefix-completions", {
        "groups": 2, "prompts_per_group": 2, "system_len": 9, "question_len": 3,
        "output_len": 2, "concurrency": 1})
    assert [path for path, _ in server.requests] == ["/v1/completions"] * 4
    for _, body in server.requests:
        assert "messages" not in body and body["prompt"].count("\n\n") == 1
        assert body["stream"] and body["stream_options"] == {"include_usage": True}
        assert body["max_tokens"] == 2 and body["ignore_eos"] is True
    assert all(r.ok and r.ttft is not None for r in result.records)
    assert {(r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.replica)
            for r in result.records} == {(11, 2, 3, "r0")}
    assert [p.prompt for p in result.prompts] == [b["prompt"] for _, b in server.requests]
    assert all(p.messages == () for p in result.prompts)


async def test_flattened_splices_the_streamed_answer_into_one_message() -> None:
    server, result = await _drive("flattened", {"users": 1, "rounds": 3, "first_len": 5,
                                                "turn_len": 2, "output_len": 2})
    contents = []
    for path, body in server.requests:
        assert path == "/v1/chat/completions"
        (message,) = body["messages"]
        contents.append(message["content"])
    assert contents[1].startswith(contents[0] + "\n\nANSWER1 more\n\n")
    assert contents[2].startswith(contents[1] + "\n\nANSWER2 more\n\n")
    assert all(r.ok for r in result.records) and len(result.records) == 3


async def test_agent_sends_tools_and_drops_the_answers() -> None:
    server, result = await _drive("agent", {"sessions": 1, "steps": 3, "system_len": 5,
                                            "task_len": 3, "result_len": 4, "output_len": 2})
    assert len(server.requests) == 3
    for step, (_, body) in enumerate(server.requests):
        assert body["tools"] == list(TOOLS) and body["tool_choice"] == "none"
        assert [m["role"] for m in body["messages"]][-2:] == ["assistant", "tool"]
        assert len(body["messages"]) == 2 + 2 * (step + 1)
        assert "ANSWER" not in json.dumps(body["messages"]), "no answer is resent"
    assert result.prompts[-1].tools == TOOLS


async def test_a_bounded_run_does_not_wait_for_arrivals_past_its_end(monkeypatch: Any) -> None:
    # Three bursts 100 s apart, a run of 1 s: the first burst is sent, the other two are
    # counted unsent, and the driver does not sleep until their arrival times.
    from loadtest import driver

    waits: list[float] = []
    real_sleep = driver.asyncio.sleep

    async def recorded(delay: float, *args: Any) -> Any:
        waits.append(delay)
        return await real_sleep(0)

    monkeypatch.setattr(driver.asyncio, "sleep", recorded)
    server = _Server()
    client = server.client()
    now = itertools.count()
    result = await drive(build_workload("burst", {"bursts": 3, "burst_size": 2, "gap": 100.0,
                                                  "prefix_len": 8, "question_len": 4}),
                         client, "m", clock=lambda: next(now) * 1e-3, max_duration=1.0)
    await client.close()
    assert len(server.requests) == 2
    assert result.unsent == 4
    assert not [w for w in waits if w > 1.0]
