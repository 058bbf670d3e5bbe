"""Requests routing cannot analyse are answered by the replica, never with a 500."""

from __future__ import annotations

import gzip

import orjson
import pytest

from .fake_replica import FakeReplica
from .test_gateway_core import CHAT, gateway

NESTED_LOOPS = "{% for i in range(8000) %}{% for j in range(8000) %}x{% endfor %}{% endfor %}"


def _sample(metrics: str, name: str, **labels: str) -> float | None:
    for line in metrics.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


@pytest.mark.parametrize("prompt", [[-1], [4294967296], [[-5]], [1, 2**63]])
async def test_token_ids_out_of_range_go_to_the_replica(prompt: list) -> None:
    replica = FakeReplica("a")
    async with gateway([replica]) as client:
        response = await client.post("/v1/completions", json={"model": "m", "prompt": prompt})
        metrics = (await client.get("/metrics")).text
    assert response.status_code == 200  # the replica's answer (vLLM's own would be a 400)
    assert replica.requests[-1]["prompt"] == prompt
    assert _sample(metrics, "prefixgate_routing_fallbacks_total", reason="token_ids") == 1


async def test_a_client_template_is_forwarded_and_routed_on_the_models() -> None:
    replica = FakeReplica("a")
    body = {**CHAT, "chat_template": NESTED_LOOPS}
    async with gateway([replica]) as client:
        response = await client.post("/v1/chat/completions", json=body)
        metrics = (await client.get("/metrics")).text
    assert response.status_code == 200
    assert replica.requests[-1]["chat_template"] == NESTED_LOOPS
    assert _sample(metrics, "prefixgate_routing_fallbacks_total", reason="client_template") == 1


async def test_deeply_nested_tools_and_messages_never_fail() -> None:
    deep = "[" * 600 + '"leaf"' + "]" * 600  # deeper than orjson and the templates' json encode
    user = '{"role": "user", "content": "x"}'
    shapes = [('{"model": "m", "messages": [USER], "tools": [{"type": "function", '
              '"function": {"name": "f", "parameters": DEEP}}]}'),
              '{"model": "m", "messages": [{"role": "user", "content": "x", "extra": DEEP}]}',
              ('{"model": "m", "messages": [USER, {"role": "assistant", "content": "",'
              ' "tool_calls": [{"function": {"arguments": DEEP}}]}, USER]}')]
    bodies = [shape.replace("USER", user).replace("DEEP", deep) for shape in shapes]
    replica = FakeReplica("a")
    async with gateway([replica]) as client:
        for body in bodies:
            response = await client.post("/v1/chat/completions", content=body,
                                         headers={"content-type": "application/json"})
            assert response.status_code == 200, response.text
        metrics = (await client.get("/metrics")).text
    assert len(replica.requests) == 3
    assert _sample(metrics, "prefixgate_routing_fallbacks_total", reason="oversize") == 3


async def test_the_memos_sizes_are_in_the_metrics() -> None:
    async with gateway([FakeReplica("a")]) as client:
        for i in range(3):
            await client.post("/v1/chat/completions", json={
                **CHAT, "messages": [{"role": "user", "content": f"question {i} " * 50}]})
        metrics = (await client.get("/metrics")).text
    entries = _sample(metrics, "prefixgate_memo_entries", model="*", memo="pieces")
    size = _sample(metrics, "prefixgate_memo_bytes", model="*", memo="pieces")
    limit = _sample(metrics, "prefixgate_memo_bytes_limit", model="*", memo="pieces")
    assert entries is not None and entries >= 3
    assert size is not None and limit is not None and 0 < size <= limit
    assert _sample(metrics, "prefixgate_memo_entries", model="*", memo="compiled_templates") == 0


async def test_the_openapi_document_describes_the_routed_bodies() -> None:
    async with gateway([FakeReplica("a")]) as client:
        document = (await client.get("/openapi.json")).json()
    chat = document["paths"]["/v1/chat/completions"]["post"]
    ref = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/ChatCompletionRequest")
    schemas = document["components"]["schemas"]
    assert "messages" in schemas["ChatCompletionRequest"]["required"]
    assert "prompt" in schemas["CompletionRequest"]["properties"]
    assert "4XX" in chat["responses"] and "/health" in document["paths"]
    messages = document["paths"]["/v1/messages"]["post"]["responses"]["4XX"]
    shapes = messages["content"]["application/json"]["schema"]["anyOf"]
    assert [shape["$ref"].rsplit("/", 1)[1] for shape in shapes] == [
        "AnthropicErrorResponse", "ErrorResponse"]


async def test_a_deep_body_without_model_gets_the_model_added_as_sent() -> None:
    deep = "[" * 300 + "1" + "]" * 300  # deeper than orjson re-encodes (255 levels)
    body = '{"messages": [{"role": "user", "content": "x"}], "extra": DEEP}'.replace("DEEP", deep)
    replica = FakeReplica("a")
    async with gateway([replica]) as client:
        response = await client.post("/v1/chat/completions", content=body,
                                     headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert replica.requests[-1]["model"] == "m"
    assert replica.requests[-1]["messages"] == [{"role": "user", "content": "x"}]


async def test_nan_and_infinity_go_to_the_replica_as_sent(qwen_dir: str) -> None:
    # Python's json writes NaN and Infinity (allow_nan), and vLLM reads them: a NaN in
    # metadata, an infinite bound in a tool's schema are no error there (a 400 here before).
    tools = ('[{"type": "function", "function": {"name": "f", "parameters": {"type": '
             '"object", "properties": {"a": {"type": "number", "maximum": Infinity}}}}}]')
    bodies = [('{"model": "m", "messages": [{"role": "user", "content": "x"}], '
               '"metadata": {"x": NaN}, "length_penalty": -Infinity}'),
              '{"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": TOOLS}'
              .replace("TOOLS", tools),
              '{"model": "m", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
              '{"model": "m", "prompt": "a\\udc00", "temperature": 1e400}']
    replica = FakeReplica("a")
    async with gateway([replica], models=[{"name": "m", "tokenizer": qwen_dir}]) as client:
        for body in bodies:
            path = "/v1/completions" if '"prompt"' in body else "/v1/chat/completions"
            response = await client.post(path, content=body,
                                         headers={"content-type": "application/json"})
            assert response.status_code == 200, response.text
    # (the replica also got the tokenizer's render checks)
    assert any(str(r.get("metadata", {}).get("x")) == "nan" for r in replica.requests)
    assert any(r.get("prompt") == "a\udc00" for r in replica.requests)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32-be", "utf-8-sig"])
async def test_a_body_in_another_unicode_encoding_gets_the_model_added(encoding: str) -> None:
    # vLLM's JSON reader takes UTF-16 and UTF-32 bodies: the model the gateway adds must
    # not be appended as UTF-8 bytes to them (vLLM could not read the result).
    body = '{"messages": [{"role": "user", "content": "x"}], "max_tokens": 3}'.encode(encoding)
    replica = FakeReplica("a")
    async with gateway([replica]) as client:
        response = await client.post("/v1/chat/completions", content=body,
                                     headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    assert replica.requests[-1] == {"messages": [{"role": "user", "content": "x"}],
                                    "max_tokens": 3, "model": "m"}


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/json; charset=utf-8"])
async def test_the_content_type_goes_on_as_the_client_sent_it(content_type: str | None) -> None:
    # vLLM refuses a JSON route's body without `application/json` (a 400); a body sent
    # with no content type at all (requests' `data=json.dumps(...)`) got one added here.
    replica = FakeReplica("a")
    headers = {"content-type": content_type} if content_type else {}
    async with gateway([replica]) as client:
        response = await client.post("/v1/chat/completions", headers=headers,
                                     content=b'{"model": "m", "messages": []}')
    assert response.status_code == 200
    assert replica.headers_seen[-1].get("content-type") == content_type


async def test_a_compressed_body_gets_a_400_that_says_why() -> None:
    # vLLM reads bodies uncompressed too (its 400: "There was an error parsing the body");
    # the gateway's said "str is not valid UTF-8: surrogates not allowed".
    replica = FakeReplica("a")
    async with gateway([replica]) as client:
        response = await client.post(
            "/v1/chat/completions", content=gzip.compress(orjson.dumps(CHAT)),
            headers={"content-type": "application/json", "content-encoding": "gzip"})
        plain = await client.post("/v1/chat/completions", content=orjson.dumps(CHAT),
                                  headers={"content-type": "application/json",
                                           "content-encoding": "gzip"})
    assert response.status_code == 400
    assert "Content-Encoding 'gzip'" in response.json()["error"]["message"]
    assert plain.status_code == 200  # the body, not the header, decides (as in vLLM)
