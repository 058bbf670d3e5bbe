"""The simulator's Responses API: ``POST /v1/responses``, ``GET /v1/responses/{id}``,
``POST /v1/responses/{id}/cancel``, as vLLM 0.32 serves them with
``VLLM_ENABLE_RESPONSES_API_STORE=1`` (``vllm/entrypoints/openai/responses``).

* The request's ``instructions`` and ``input`` (a string, or items: messages
  whose content is a string or ``input_text``/``output_text`` parts, an
  agent's ``function_call`` and ``function_call_output`` items as the chat
  tool calls and tool messages they stand for, ``reasoning`` items left out)
  are rendered as a chat prompt with the request's function ``tools``, after
  the stored conversation of ``previous_response_id`` when one is named; an
  unknown id is vLLM's 404 ``Response with id '...' not found.`` (``param``
  ``response_id``).
* The answer is planned as a chat answer is (``engine.sim.answers``: text, or
  calls of the function tools by ``tool_choice``) and is vLLM's
  ``ResponsesResponse``: ``id`` ``resp_...``, ``object: "response"``,
  ``status: "completed"``, a ``message`` output item with an ``output_text``
  part and/or one ``function_call`` item per call (``call_id``, ``name``,
  JSON ``arguments``), ``usage`` with ``input_tokens``, ``output_tokens``,
  ``total_tokens`` and their details.
* A stream is vLLM's SSE events (``event: <type>`` then ``data: {...}``),
  numbered by ``sequence_number``: ``response.created``,
  ``response.in_progress``, ``response.output_item.added``,
  ``response.content_part.added``, one ``response.output_text.delta`` per
  token, ``response.output_text.done``, ``response.content_part.done``,
  ``response.output_item.done``, ``response.completed``; a function call is
  its own item: ``response.output_item.added``,
  ``response.function_call_arguments.delta`` per token,
  ``response.function_call_arguments.done``, ``response.output_item.done``.
* Unless ``store`` is false the response and its conversation are kept in
  this server's memory (bounded; the oldest are forgotten), which is why a
  follow-up must come back to the same replica. Cancelling a finished
  response is vLLM's 400 ``Cannot cancel a synchronous response.``
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from engine.api_shapes import responses_messages, responses_tools
from engine.sim.answers import parse_output_rules
from engine.sim.chat_choice import ChatChoice
from engine.sim.chat_route import plan_choices
from engine.sim.protocol import SimError, bad_request, check_length, parse_sampling
from engine.sim.request import TokenEvent
from engine.sim.route_io import collect_events, json_response, output_spec, read_json
from engine.sim.runtime import Generation, SimRuntime
from policies.lru import LRU

STORE_CAPACITY = 10_000

Finish = Callable[[dict[str, Any]], dict[str, Any]]
"""The finished response from its usage (stored on the way)."""


@dataclass(slots=True)
class Stored:
    response: dict[str, Any]
    messages: list[dict[str, Any]]
    """The conversation so far, the response's own output included."""


def not_found(response_id: str) -> SimError:
    return SimError(404, f"Response with id '{response_id}' not found.",
                    "invalid_request_error", "response_id")


def input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """``instructions`` and ``input`` as the chat messages vLLM makes of them
    (``engine.api_shapes``, shared with the gateway's routing); an item with no chat form
    is refused."""
    given = body.get("input")
    if not isinstance(given, (str, list)):
        raise bad_request("input: Input should be a valid string or list of items", "input")
    messages, complete = responses_messages(body)
    if not complete:
        raise bad_request("input: each item must be a message with a role, a "
                          "function_call, a function_call_output or reasoning", "input")
    return messages


def chat_tools(body: dict[str, Any]) -> dict[str, Any]:
    """The request's function ``tools`` and ``tool_choice`` in chat's form, as vLLM renders
    them (built-in tools have no simulated form and are left out)."""
    tools = responses_tools(body.get("tools"))
    if not tools:
        return {}
    choice = body.get("tool_choice", "auto")
    if isinstance(choice, dict) and choice.get("type") == "function":
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return {"tools": tools, "tool_choice": choice}


def output_items(response_id: str, message: dict[str, Any]) -> list[dict[str, Any]]:
    """An answer's chat message as vLLM's output items: its text a ``message`` item, each
    tool call a ``function_call`` item."""
    items = []
    if message.get("content"):
        items.append(message_item(response_id, message["content"], "completed"))
    for call in message.get("tool_calls") or []:
        items.append(function_call_item(call["id"], call["function"]["name"],
                                        call["function"]["arguments"], "completed"))
    return items


def function_call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": f"fc_{call_id.rsplit('-', 1)[-1]}", "type": "function_call",
            "call_id": call_id, "name": name, "arguments": arguments, "status": status}


def response_object(response_id: str, body: dict[str, Any], model: str, created: int,
                    status: str, output: list[dict[str, Any]],
                    usage: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": response_id, "created_at": created, "incomplete_details": None,
        "instructions": body.get("instructions"), "metadata": body.get("metadata"),
        "model": model, "object": "response", "output": output,
        "parallel_tool_calls": True, "temperature": body.get("temperature", 1.0),
        "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools", []),
        "top_p": body.get("top_p", 1.0), "background": bool(body.get("background", False)),
        "max_output_tokens": body.get("max_output_tokens"), "max_tool_calls": None,
        "previous_response_id": body.get("previous_response_id"), "prompt": None,
        "reasoning": None, "service_tier": "auto", "status": status, "text": None,
        "top_logprobs": None, "truncation": "disabled", "usage": usage,
        "user": body.get("user"),
    }


def message_item(response_id: str, text: str, status: str) -> dict[str, Any]:
    return {"id": f"msg_{response_id[5:]}", "type": "message", "role": "assistant",
            "status": status,
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": None}]}


def response_usage(prompt_tokens: int, output_tokens: int, cached: int) -> dict[str, Any]:
    return {"input_tokens": prompt_tokens, "output_tokens": output_tokens,
            "total_tokens": prompt_tokens + output_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens_details": {"reasoning_tokens": 0}}


def sse(event: dict[str, Any]) -> bytes:
    return b"event: " + event["type"].encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"


def build_responses_router(runtime: SimRuntime) -> APIRouter:
    router = APIRouter()
    store: LRU[str, Stored] = LRU(STORE_CAPACITY)
    config = runtime.config
    model_name = config.served_model_name

    @router.post("/v1/responses")
    async def create(request: Request) -> Response:
        body, size = await read_json(request)
        sampling = parse_sampling(body, chat=False)
        runtime.check_model(sampling.model)
        messages = input_messages(body)
        tools = chat_tools(body)
        rules = parse_output_rules(tools)
        previous = body.get("previous_response_id")
        if previous is not None:
            stored = store.get(str(previous))
            if stored is None:
                raise not_found(str(previous))
            messages = stored.messages + messages
        prompt = await runtime.chat_token_ids({"messages": messages, **tools}, size)
        max_tokens = check_length(len(prompt), body.get("max_output_tokens"),
                                  config.max_model_len)
        plans, keys = plan_choices(rules, messages, sampling, prompt, config.seed)
        choice = ChatChoice(0, plans[0], None, keys[0])
        response_id = "resp_" + uuid.uuid4().hex
        created = int(time.time())
        generation = runtime.submit(response_id, prompt, output_spec(sampling, max_tokens), 1,
                                    sampling.cache_salt, scripts=[plans[0].script])
        keep = body.get("store", True) is not False

        def finished(usage: dict[str, Any]) -> dict[str, Any]:
            message = choice.message()
            answer = response_object(response_id, body, model_name, created, "completed",
                                     output_items(response_id, message), usage)
            if keep:
                said = {key: value for key, value in message.items()
                        if key in ("role", "content", "tool_calls") and value}
                store.put(response_id, Stored(answer, [*messages, {"content": None, **said}]))
            return answer

        if sampling.stream:
            start = response_object(response_id, body, model_name, created, "in_progress",
                                    [], None)
            return StreamingResponse(_stream(runtime, generation, response_id, choice, start,
                                             finished), media_type="text/event-stream")
        def feed(event: TokenEvent) -> None:
            choice.feed(event)

        cached = await collect_events(request, runtime, [generation], 1, feed)
        if cached is None:
            return json_response({"error": "client disconnected"}, 499)
        return json_response(finished(response_usage(len(prompt), choice.num_tokens,
                                                     cached.get(0, 0))))

    @router.get("/v1/responses/{response_id}")
    async def retrieve(response_id: str) -> Response:
        stored = store.get(response_id)
        if stored is None:
            raise not_found(response_id)
        return json_response(stored.response)

    @router.post("/v1/responses/{response_id}/cancel")
    async def cancel(response_id: str) -> Response:
        stored = store.get(response_id)
        if stored is None:
            raise not_found(response_id)
        if stored.response["status"] not in ("queued", "in_progress"):
            raise SimError(400, "Cannot cancel a synchronous response.",
                           "invalid_request_error", "response_id")
        stored.response["status"] = "cancelled"
        return json_response(stored.response)

    return router


async def _stream(runtime: SimRuntime, generation: Generation, response_id: str,
                  choice: ChatChoice, start: dict[str, Any],
                  finished: Finish) -> AsyncIterator[bytes]:
    """vLLM's events: the text in a ``message`` item (``output_text`` deltas), each tool
    call in a ``function_call`` item (``function_call_arguments`` deltas), each item added,
    filled and done in turn, then ``response.completed``."""
    sequence = iter(range(1 << 30))
    message_id = f"msg_{response_id[5:]}"
    text, cached, index = "", 0, -1
    open_item: dict[str, Any] | None = None  # the item being streamed
    part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [],
                            "logprobs": None}

    def event(kind: str, **fields: Any) -> bytes:
        return sse({**fields, "sequence_number": next(sequence), "type": kind})

    def close() -> list[bytes]:
        nonlocal open_item
        item, open_item = open_item, None
        if item is None:
            return []
        if item["type"] == "message":
            return [event("response.output_text.done", item_id=message_id, output_index=index,
                          content_index=0, text=text, logprobs=[]),
                    event("response.content_part.done", item_id=message_id,
                          output_index=index, content_index=0, part={**part, "text": text}),
                    event("response.output_item.done", output_index=index,
                          item=message_item(response_id, text, "completed"))]
        done = {**item, "status": "completed"}
        return [event("response.function_call_arguments.done", item_id=item["id"],
                      output_index=index, arguments=item["arguments"], name=item["name"]),
                event("response.output_item.done", output_index=index, item=done)]

    def begin(item: dict[str, Any]) -> list[bytes]:
        nonlocal open_item, index
        out = close()
        open_item, index = item, index + 1
        added = item if item["type"] == "function_call" else {**item, "content": []}
        out.append(event("response.output_item.added", output_index=index, item=added))
        if item["type"] == "message":
            out.append(event("response.content_part.added", item_id=message_id,
                             output_index=index, content_index=0, part=part))
        return out

    try:
        yield event("response.created", response=start)
        yield event("response.in_progress", response=start)
        while True:
            token = await generation.queue.get()
            if token.num_output_tokens == 1:
                cached = token.num_cached_tokens
            delta = choice.feed(token) or {}
            if delta.get("content"):
                if open_item is None or open_item["type"] != "message":
                    for out in begin(message_item(response_id, "", "in_progress")):
                        yield out
                text += delta["content"]
                yield event("response.output_text.delta", item_id=message_id,
                            output_index=index, content_index=0, delta=delta["content"],
                            logprobs=[])
            for call in delta.get("tool_calls") or []:
                function = call.get("function") or {}
                if call.get("id") is not None:
                    for out in begin(function_call_item(call["id"], function.get("name") or "",
                                                        "", "in_progress")):
                        yield out
                arguments = function.get("arguments")
                if arguments and open_item is not None:
                    open_item["arguments"] += arguments
                    yield event("response.function_call_arguments.delta",
                                item_id=open_item["id"], output_index=index, delta=arguments)
            if token.finish_reason is not None:
                break
        for out in close():
            yield out
        usage = response_usage(len(generation.prompt_token_ids), choice.num_tokens, cached)
        yield event("response.completed", response=finished(usage))
    finally:
        runtime.abort(generation)
