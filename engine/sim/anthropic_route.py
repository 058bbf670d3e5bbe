"""The Anthropic Messages API of the simulator: ``POST /v1/messages`` and
``POST /v1/messages/count_tokens``, as vLLM 0.32 serves them on every server that
generates (``vllm/entrypoints/anthropic/``), so Claude Code or the Anthropic SDK
pointed at a simulated fleet gets what a real one answers.

As in vLLM, a Messages request is turned into the chat request it stands for
(``engine.api_shapes``, the conversion the gateway's routing renders too) and
answered by the chat route (``engine.sim.chat_route.answer_chat``: the same prompt,
prefix cache, scheduler and KV events):

* ``system`` (a string or text blocks, less Claude Code's per-request
  ``x-anthropic-billing-header`` block) and any system-role message become one
  system message; text blocks stay text, an image block an ``image_url`` part, a
  ``tool_use`` block an assistant tool call, a ``tool_result`` block a tool
  message, a ``thinking`` block the message's ``reasoning``;
* ``tools`` become functions (``input_schema`` the parameters; ``tool_choice``
  auto/any/tool/none as auto/required/named/none), ``stop_sequences`` the stop
  strings, ``max_tokens``, sampling and ``cache_salt`` as they are; a stream asks
  for usage on every chunk.

The answer goes back the other way: a message with ``text`` and ``tool_use``
blocks (an empty text block when there is nothing else), ``stop_reason``
``end_turn``/``max_tokens``/``stop_sequence``/``tool_use``, and usage split as
Anthropic does (``cache_read_input_tokens`` what the prefix cache held,
``cache_creation_input_tokens`` what the prefill wrote to it, ``input_tokens`` the
rest); a stream sends ``message_start``, a
``content_block_start``/``delta``/``stop`` run per block, ``message_delta``
with the stop reason and usage, and ``message_stop``.

Errors: a body that is not a Messages request (no ``model``, ``messages`` or
``max_tokens``) is refused as vLLM's request validation refuses it (OpenAI-shaped,
400); what the chat path refuses after that (an unknown model, too long a prompt)
comes back Anthropic-shaped (``{"type": "error", "error": {type, message}}``) with
its status, as vLLM translates it.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from engine.api_shapes import anthropic_messages, anthropic_tools
from engine.sim.chat_route import answer_chat
from engine.sim.protocol import SimError, validation_error
from engine.sim.route_io import json_response, read_json
from engine.sim.runtime import SimRuntime

_TOOL_CHOICE = {"auto": "auto", "any": "required", "none": "none"}
_STOP_REASON = {"length": "max_tokens", "tool_calls": "tool_use"}


def anthropic_error(exc: SimError) -> Response:
    return Response(orjson.dumps({"type": "error", "error": {
        "type": exc.err_type, "message": exc.message}}), status_code=exc.status,
        media_type="application/json")


def _require(body: dict[str, Any], field: str, kind: type, label: str, code: str) -> Any:
    value = body.get(field)
    if value is None:
        raise validation_error((field,), "Field required", None, "missing")
    if not isinstance(value, kind) or isinstance(value, bool):
        raise validation_error((field,), f"Input should be a valid {label}", value, code)
    return value


def to_chat(body: dict[str, Any], count_only: bool = False) -> dict[str, Any]:
    """A Messages API body as the chat request vLLM makes of it (validated as vLLM does)."""
    model = _require(body, "model", str, "string", "string_type")
    given = _require(body, "messages", list, "list", "list_type")
    for index, message in enumerate(given):
        if not isinstance(message, dict) or message.get("role") not in (
                "user", "assistant", "system"):
            raise validation_error(("messages", index, "role"),
                                   "Input should be 'user', 'assistant' or 'system'",
                                   message.get("role") if isinstance(message, dict) else message,
                                   "literal_error")
    chat: dict[str, Any] = {"model": model, "messages": anthropic_messages(body)}
    for field in ("cache_salt", "chat_template_kwargs"):
        if body.get(field) is not None:
            chat[field] = body[field]
    tools = body.get("tools")
    if isinstance(tools, list):
        chat["tools"] = anthropic_tools(tools)
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        chat["tool_choice"] = _TOOL_CHOICE.get(str(choice.get("type"))) or {
            "type": "function", "function": {"name": choice.get("name")}}
    elif tools:
        chat["tool_choice"] = "auto"
    if count_only:
        return chat
    chat["max_tokens"] = _require(body, "max_tokens", int, "integer", "int_type")
    for ours, theirs in (("stop", "stop_sequences"), ("temperature", "temperature"),
                         ("top_p", "top_p"), ("top_k", "top_k")):
        if body.get(theirs) is not None:
            chat[ours] = body[theirs]
    if body.get("stream"):
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return chat


def anthropic_usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    if not usage:
        return {"input_tokens": 0, "output_tokens": 0}
    out = {"input_tokens": usage.get("prompt_tokens") or 0,
           "output_tokens": usage.get("completion_tokens") or 0}
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        cached, created = details["cached_tokens"], details.get("created_cache_tokens") or 0
        out.update(input_tokens=max(0, out["input_tokens"] - cached - created),
                   cache_creation_input_tokens=created, cache_read_input_tokens=cached)
    return out


def stop_reason(finish: str | None, stop: Any, tool_used: bool) -> tuple[str | None, Any]:
    if finish == "length":
        return "max_tokens", None
    if finish not in ("stop", "tool_calls"):
        return None, None
    if tool_used:
        return "tool_use", None
    if isinstance(stop, str):
        return "stop_sequence", stop
    return _STOP_REASON.get(finish, "end_turn"), None


def to_message(chat: dict[str, Any]) -> dict[str, Any]:
    """A chat completion as the Anthropic message vLLM answers with."""
    choice = chat["choices"][0]
    message = choice["message"]
    calls = message.get("tool_calls") or []
    blocks: list[dict[str, Any]] = []
    if message.get("reasoning"):
        blocks.append({"type": "thinking", "thinking": message["reasoning"],
                       "signature": chat["id"]})
    if message.get("content"):
        blocks.append({"type": "text", "text": message["content"]})
    for call in calls:
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                       "input": orjson.loads(call["function"]["arguments"] or "{}")})
    reason, sequence = stop_reason(choice.get("finish_reason"), choice.get("stop_reason"),
                                   bool(calls))
    answer: dict[str, Any] = {
        "id": chat["id"], "type": "message", "role": "assistant",
        "content": blocks or [{"type": "text", "text": ""}], "model": chat["model"],
        "stop_reason": reason, "usage": anthropic_usage(chat.get("usage"))}
    if sequence is not None:
        answer["stop_sequence"] = sequence
    return answer


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps({"type": kind, **data}) \
        + b"\n\n"


async def to_events(chunks: AsyncIterable[Any]) -> AsyncIterator[bytes]:
    """A chat stream (SSE bytes) as the Anthropic events vLLM sends for it."""
    block: str | None = None  # the open block's type
    index = 0
    finish: str | None = None
    stop: Any = None
    tool_used = False
    started = False
    buffer = b""

    def close() -> list[bytes]:
        nonlocal block, index
        if block is None:
            return []
        block = None
        index += 1
        return [_event("content_block_stop", {"index": index - 1})]

    def open_block(kind: str, content: dict[str, Any]) -> list[bytes]:
        nonlocal block
        out = close()
        block = kind
        return out + [_event("content_block_start", {"content_block": content, "index": index})]

    async for raw in chunks:
        buffer += raw if isinstance(raw, bytes) else str(raw).encode()
        while b"\n\n" in buffer:
            line, buffer = buffer.split(b"\n\n", 1)
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                for event in close():
                    yield event
                yield _event("message_stop", {})
                continue
            chunk = orjson.loads(payload)
            if not started:
                started = True
                yield _event("message_start", {"message": {
                    "id": chunk["id"], "type": "message", "role": "assistant", "content": [],
                    "model": chunk["model"], "stop_reason": None, "stop_sequence": None,
                    "usage": anthropic_usage(chunk.get("usage"))}})
                continue
            if not chunk.get("choices"):  # the usage chunk that ends the stream
                for event in close():
                    yield event
                reason, sequence = stop_reason(finish or "stop", stop, tool_used)
                yield _event("message_delta", {
                    "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": anthropic_usage(chunk.get("usage"))})
                continue
            choice = chunk["choices"][0]
            if choice.get("finish_reason") is not None:
                finish, stop = choice["finish_reason"], choice.get("stop_reason")
            delta = choice.get("delta") or {}
            if delta.get("content"):
                if block != "text":
                    for event in open_block("text", {"type": "text", "text": ""}):
                        yield event
                yield _event("content_block_delta", {"delta": {
                    "type": "text_delta", "text": delta["content"]}, "index": index})
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                if call.get("id") is not None and function.get("name") is not None:
                    tool_used = True
                    for event in open_block("tool_use", {"type": "tool_use", "id": call["id"],
                                                         "name": function["name"],
                                                         "input": {}}):
                        yield event
                if function.get("arguments") and block == "tool_use":
                    yield _event("content_block_delta", {"delta": {
                        "type": "input_json_delta", "partial_json": function["arguments"]},
                        "index": index})


def build_anthropic_router(runtime: SimRuntime) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/messages")
    async def messages(request: Request) -> Response:
        timing = runtime.timings.received(request.headers.get("x-request-id"))
        body, size = await read_json(request)
        chat = to_chat(body)
        try:
            answer = await answer_chat(runtime, request, chat, size, timing)
        except SimError as exc:
            return anthropic_error(exc)
        if isinstance(answer, StreamingResponse):
            return StreamingResponse(to_events(answer.body_iterator),
                                     media_type="text/event-stream")
        if answer.status_code != 200:
            return answer
        return json_response(to_message(orjson.loads(bytes(answer.body))))

    @router.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Response:
        body, size = await read_json(request)
        chat = to_chat(body, count_only=True)
        try:
            runtime.check_model(chat["model"])
            count = len(await runtime.chat_token_ids(chat, size, False))
        except SimError as exc:
            return anthropic_error(exc)
        return json_response({"input_tokens": count,
                              "context_management": {"original_input_tokens": count}})

    return router
