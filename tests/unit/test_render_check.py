"""The render check's verdicts on what a replica's /tokenize answers (the integration and
e2e tests run it against the simulator and a real vLLM)."""

from __future__ import annotations

import json

import httpx

from engine.backends.base import Timeouts
from engine.backends.httpx_client import HttpxBackend
from engine.tokenizer import HFRenderer
from gateway.prompt.render import PromptHasher
from gateway.prompt.render_check import PROBES, check_replica


def replica(handler: httpx.MockTransport) -> HttpxBackend:
    return HttpxBackend("r0", "http://r0", Timeouts(), transport=handler)


async def test_verdicts(qwen: HFRenderer) -> None:
    hasher = PromptHasher(qwen)
    asked: list[dict] = []

    def same(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        asked.append(body)
        return httpx.Response(200, json={"tokens": qwen.chat_token_ids(body)})

    match = await check_replica("m", hasher, replica(httpx.MockTransport(same)))
    assert (match.result, match.detail) == ("match", f"{len(PROBES)} probes, identical token ids")
    assert all(body["model"] == "m" and body["add_generation_prompt"] for body in asked)

    def one_more_token(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"tokens": qwen.chat_token_ids(json.loads(request.content)) + [7]})

    differs = await check_replica("m", hasher, replica(httpx.MockTransport(one_more_token)))
    assert differs.result == "differs" and "probe 'system and user'" in differs.detail

    def refuses_tools(request: httpx.Request) -> httpx.Response:  # a shape it cannot take
        body = json.loads(request.content)
        if body.get("tools"):
            return httpx.Response(400, json={"error": {"message": "no tools"}})
        return same(request)

    partial = await check_replica("m", hasher, replica(httpx.MockTransport(refuses_tools)))
    assert (partial.result, partial.detail) == ("match", f"{len(PROBES) - 1} probes, identical token ids")

    for status in (404, 401):
        none = await check_replica("m", hasher, replica(httpx.MockTransport(
            lambda request, status=status: httpx.Response(status))))
        assert none.result == "unchecked" and str(status) in none.detail

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    gone = await check_replica("m", hasher, replica(httpx.MockTransport(down)))
    assert gone.result == "unchecked" and "did not answer" in gone.detail
