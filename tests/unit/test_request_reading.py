"""What the gateway reads from a request: header forwarding, form fields, prompts, fields."""

from __future__ import annotations

import httpx
import pytest

from engine.backends.form_fields import form_fields, parts
from gateway.config import load_settings
from gateway.errors import InvalidRequest
from gateway.request.forwarding import forward_headers, is_gateway_secret
from gateway.request.prompt_shapes import prompt_of
from gateway.request.schemas import flag, parse_json, routing_fields


def never_secret(name: str) -> bool:
    return False


def test_hop_by_hop_and_connection_named_headers_are_dropped() -> None:
    headers = {"Connection": "close, X-Foo", "X-Foo": "1", "Keep-Alive": "5", "TE": "trailers",
               "Trailer": "x", "Upgrade": "h2c", "Proxy-Connection": "keep-alive",
               "Transfer-Encoding": "chunked", "Host": "gw", "Content-Length": "3",
               "User-Agent": "ua/1", "X-Bar": "2", "X-Request-Id": "client-id"}
    assert forward_headers(headers, never_secret) == {"user-agent": "ua/1", "x-bar": "2"}


def test_the_gateways_secrets_are_not_forwarded() -> None:
    headers = {"authorization": "Bearer k", "x-api-key": "k", "accept": "*/*"}
    assert forward_headers(headers, lambda name: name in ("authorization", "x-api-key")) == {
        "accept": "*/*"}


def multipart(files: dict, data: dict) -> tuple[bytes, str]:
    request = httpx.Request("POST", "http://x/", files=files, data=data)
    return request.read(), request.headers["content-type"]


def test_form_fields_are_read_and_file_parts_only_measured() -> None:
    audio = b"\r\n--not-the-boundary\r\n" + bytes(range(256)) * 10
    body, content_type = multipart({"file": ("a.wav", audio, "audio/wav")},
                                   {"model": "whisper", "stream": "true", "prompt": "x" * 5000})
    assert form_fields(body, content_type, ("model", "stream", "prompt", "file")) == {
        "model": "whisper", "stream": "true"}
    (upload,) = [p for p in parts(body, content_type) if p.name == "file"]
    assert upload.filename == "a.wav"
    assert body[upload.start:upload.end] == audio


@pytest.mark.parametrize("content_type", ["application/json", "multipart/form-data", ""])
def test_a_body_that_is_not_a_form_has_no_fields(content_type: str) -> None:
    assert form_fields(b'{"model": "m"}', content_type, ("model",)) == {}


def test_a_responses_body_renders_as_its_chat_messages() -> None:
    body = {"instructions": "Be brief.", "cache_salt": "s", "input": [
        {"role": "user", "content": "Hi"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "More"}]}]}
    assert prompt_of("responses", body) == ("chat", {"cache_salt": "s", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": [{"type": "text", "text": "More"}]}]})
    assert prompt_of("responses", {"input": "Hi"}) == (
        "chat", {"messages": [{"role": "user", "content": "Hi"}]})


def test_a_responses_agents_tool_calls_render_as_vllm_converts_them() -> None:
    """An agent's turns: instructions and tools, the task, then tool calls and their
    outputs, read as vLLM turns them into chat (function calls as the assistant's tool
    calls, merged into the assistant message before them; outputs as tool messages;
    function tools as chat tools; reasoning as the assistant's ``reasoning``); an image
    part is kept for the chat reading to stop before (``media``)."""
    task = {"role": "user", "content": "Find the invoice."}
    tool = {"type": "function", "name": "search", "parameters": {"type": "object"},
            "strict": True}
    body = {"instructions": "You are an agent.", "tools": [tool, {"type": "web_search"}],
            "input": [
        task, {"type": "message", "role": "assistant",
               "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call", "call_id": "c1", "name": "search", "arguments": "{}"},
        {"type": "function_call", "call_id": "c2", "name": "search", "arguments": "{\"q\": 1}"},
        {"type": "function_call_output", "call_id": "c1", "output": "found"},
        {"type": "function_call_output", "call_id": "c2", "output": "none"},
        {"type": "reasoning", "summary": []},
        {"role": "user", "content": "Thanks"}]}
    calls = [{"id": "c1", "type": "function", "function": {"name": "search", "arguments": "{}"}},
             {"id": "c2", "type": "function",
              "function": {"name": "search", "arguments": "{\"q\": 1}"}}]
    assert prompt_of("responses", body) == ("chat", {
        "messages": [{"role": "system", "content": "You are an agent."}, task,
                     {"role": "assistant", "content": "Looking.", "tool_calls": calls},
                     {"role": "tool", "content": "found", "tool_call_id": "c1"},
                     {"role": "tool", "content": "none", "tool_call_id": "c2"},
                     {"role": "assistant", "reasoning": ""}, {"role": "user", "content": "Thanks"}],
        "tools": [{"type": "function", "function": {
            "name": "search", "parameters": {"type": "object"}, "strict": True}}]})
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    with_image = {"input": [{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"}, image]}]}
    assert prompt_of("responses", with_image) == ("chat", {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"}, image]}]})


def test_a_responses_assistant_message_is_read_as_vllm_reads_it() -> None:
    """vLLM takes an assistant message item's first part only (a second ``output_text``
    part never reaches the prompt), and puts the text of a message that follows a tool
    call or a reasoning item into that assistant message rather than a new one."""
    call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
    two_parts = {"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": "First."}, {"type": "output_text", "text": "Second."}]}
    body = {"input": [{"role": "user", "content": "Go"}, call,
                      {"role": "assistant", "content": "Done calling."},
                      {"type": "function_call_output", "call_id": "c1", "output": "ok"},
                      two_parts, {"role": "user", "content": "Next"}]}
    assert prompt_of("responses", body) == ("chat", {"messages": [
        {"role": "user", "content": "Go"},
        {"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
         "content": "Done calling."},
        {"role": "tool", "content": "ok", "tool_call_id": "c1"},
        {"role": "assistant", "content": "First."},
        {"role": "user", "content": "Next"}]})
    refusal = {"type": "message", "role": "assistant",
               "content": [{"type": "refusal", "refusal": "No."}]}
    assert prompt_of("responses", {"input": [{"role": "user", "content": "Go"}, refusal]}) == (
        "chat", {"messages": [{"role": "user", "content": "Go"}]})


@pytest.mark.parametrize(("kind", "body"), [
    ("responses", {"input": [{"type": "function_call_output", "output": "42"}]}),
    ("responses", {"input": [{"role": "user", "content": [{"text": "no type"}]}]}),
    ("responses", {}),
    ("chat", {"messages": []}),
    ("chat", {"messages": [{"content": "no role"}]}),
    ("chat", {"messages": [{"role": "user", "content": 5}]}),
    ("completions", {"prompt_embeds": "AAAA"}),
    ("completions", {"prompt": [[]]}),
    ("embeddings", {"input": "x"}),
])
def test_bodies_without_a_renderable_prompt_have_none(kind: str, body: dict) -> None:
    assert prompt_of(kind, body) is None


@pytest.mark.parametrize("prompt", ["text", ["a", "b"], [1, 2, 3], [[1, 2], [3]]])
def test_completion_prompts_render(prompt: object) -> None:
    assert prompt_of("completions", {"prompt": prompt}) == ("completions", {"prompt": prompt})


def test_routing_fields_read_odd_types_as_absent_but_a_model_must_be_a_string() -> None:
    fields = routing_fields({"model": "m", "stream": "true", "user": 5})
    assert (fields.model, fields.stream, fields.user) == ("m", True, None)
    assert routing_fields({"stream": [1]}).stream is False
    with pytest.raises(InvalidRequest) as raised:
        routing_fields({"model": ["m"]})
    assert raised.value.param == "model"


@pytest.mark.parametrize(("value", "expected"), [
    (True, True), (False, False), (1, True), (0, False), (1.0, True), (0.0, False),
    ("True", True), ("yes", True), ("false", False), ("", False), (None, False)])
def test_flags_read_as_vllm_reads_them(value: object, expected: bool) -> None:
    assert flag(value) is expected


@pytest.mark.parametrize(("api_keys", "secret"), [(None, False), ("keys.yaml", True)])
def test_the_clients_key_is_the_gateways_secret_only_with_client_keys(
        api_keys: str | None, secret: bool) -> None:
    settings = load_settings(overrides={"replicas": [{"url": "http://r"}],
                                        "api_keys": api_keys}, env={})
    assert is_gateway_secret("authorization", settings) is secret
    assert is_gateway_secret("x-api-key", settings) is secret
    assert is_gateway_secret("proxy-authorization", settings)
    assert not is_gateway_secret("user-agent", settings)


def test_a_body_may_start_with_a_byte_order_mark_as_vllm_reads_it() -> None:
    assert parse_json(b'\xef\xbb\xbf{"model": "m"}') == {"model": "m"}


@pytest.mark.parametrize(("raw", "expected"), [
    (b'{"metadata": {"x": NaN}}', "nan"), (b'{"top_p": Infinity}', "inf"),
    (b'{"top_p": -Infinity}', "-inf"), (b'{"temperature": 1e400}', "inf")])
def test_numbers_orjson_refuses_are_read_as_vllm_reads_them(raw: bytes, expected: str) -> None:
    # vLLM reads bodies with Python's json: NaN and infinities are values, not errors.
    (value,) = parse_json(raw).values()
    assert str(value.get("x") if isinstance(value, dict) else value) == expected


def test_a_lone_surrogate_escape_is_read_as_vllm_reads_it() -> None:
    assert parse_json(b'{"prompt": "a\\ud800b"}') == {"prompt": "a\ud800b"}


@pytest.mark.parametrize("raw", [b'{"model": ', b'{"a": 1} x', b"{'a': 1}", b'{"a": nan}',
                                 b"[" * 5000 + b"]" * 5000, b'{"a": "\xff"}'])
def test_what_neither_reader_takes_is_a_400(raw: bytes) -> None:
    with pytest.raises(InvalidRequest, match="not valid (UTF-8 )?JSON"):
        parse_json(raw)


def test_a_body_that_is_not_utf8_says_so() -> None:
    with pytest.raises(InvalidRequest, match="not valid UTF-8 JSON: 'utf-8' codec can't decode"):
        parse_json('{"prompt": "café"}'.encode("latin-1"))


def test_a_body_nested_past_orjsons_depth_says_so_without_pythons_reader() -> None:
    """Python's reader recursed to its limit on it first, where a garbage collection's
    callback failed too (``Exception ignored``, which CI's odd-body test caught)."""
    with pytest.raises(InvalidRequest, match="nested too deep"):
        parse_json(b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}")
