"""The simulator's Responses API: ``POST /v1/responses``, ``GET /v1/responses/{id}``,
``POST /v1/responses/{id}/cancel``, as vLLM 0.32 serves them with
``VLLM_ENABLE_RESPONSES_API_STORE=1`` (``vllm/entrypoints/openai/responses``).

* The request's ``instructions`` and ``input`` (a string, or message items
  whose content is a string or ``input_text``/``output_text`` parts) are
  rendered as a chat prompt, after the stored conversation of
  ``previous_response_id`` when one is named; an unknown id is vLLM's 404
  ``Response with id '...' not found.`` (``param`` ``response_id``).
* The answer is vLLM's ``ResponsesResponse``: ``id`` ``resp_...``,
  ``object: "response"``, ``status: "completed"``, one ``message`` output
  item with an ``output_text`` part, ``usage`` with ``input_tokens``,
  ``output_tokens``, ``total_tokens`` and their details.
* A stream is vLLM's SSE events (``event: <type>`` then ``data: {...}``),
  numbered by ``sequence_number``: ``response.created``,
  ``response.in_progress``, ``response.output_item.added``,
  ``response.content_part.added``, one ``response.output_text.delta`` per
  token, ``response.output_text.done``, ``response.content_part.done``,
  ``response.output_item.done``, ``response.completed``.
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

from engine.sim.protocol import SimError, bad_request, check_length, parse_sampling
from engine.sim.route_io import ChoiceResult, collect, json_response, output_spec, read_json
from engine.sim.runtime import Generation, SimRuntime
from policies.lru import LRU

STORE_CAPACITY = 10_000

Finish = Callable[[str, dict[str, Any]], dict[str, Any]]
"""The finished response from its text and usage (stored on the way)."""


@dataclass(slots=True)
class Stored:
    response: dict[str, Any]
    messages: list[dict[str, Any]]
    """The conversation so far, the response's own output included."""


def not_found(response_id: str) -> SimError:
    return SimError(404, f"Response with id '{response_id}' not found.",
                    "invalid_request_error", "response_id")


def input_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str):
        messages.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    if not isinstance(given, list):
        raise bad_request("input: Input should be a valid string or list of items", "input")
    for item in given:
        if not isinstance(item, dict) or not isinstance(item.get("role"), str):
            raise bad_request("input: each item must be a message with a role", "input")
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(str(part.get("text", "")) for part in content
                              if isinstance(part, dict))
        messages.append({"role": item["role"], "content": content})
    return messages


def response_object(response_id: str, body: dict[str, Any], model: str, created: int,
                    status: str, text: str | None, usage: dict[str, Any] | None) -> dict[str, Any]:
    output = [] if text is None else [message_item(response_id, text, "completed")]
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
        previous = body.get("previous_response_id")
        if previous is not None:
            stored = store.get(str(previous))
            if stored is None:
                raise not_found(str(previous))
            messages = stored.messages + messages
        prompt = await runtime.chat_token_ids({"messages": messages}, size)
        max_tokens = check_length(len(prompt), body.get("max_output_tokens"),
                                  config.max_model_len)
        response_id = "resp_" + uuid.uuid4().hex
        created = int(time.time())
        generation = runtime.submit(response_id, prompt, output_spec(sampling, max_tokens), 1,
                                    sampling.cache_salt)
        keep = body.get("store", True) is not False

        def finished(text: str, usage: dict[str, Any]) -> dict[str, Any]:
            answer = response_object(response_id, body, model_name, created, "completed",
                                     text, usage)
            if keep:
                store.put(response_id, Stored(answer, [
                    *messages, {"role": "assistant", "content": text}]))
            return answer

        if sampling.stream:
            start = response_object(response_id, body, model_name, created, "in_progress",
                                    None, None)
            return StreamingResponse(_stream(runtime, generation, response_id, start, finished),
                                     media_type="text/event-stream")
        choices = [ChoiceResult()]
        cached = await collect(request, runtime, [generation], choices)
        if cached is None:
            return json_response({"error": "client disconnected"}, 499)
        usage = response_usage(len(prompt), choices[0].num_tokens, cached.get(0, 0))
        return json_response(finished(choices[0].text, usage))

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
                  start: dict[str, Any], finished: Finish) -> AsyncIterator[bytes]:
    sequence = iter(range(1 << 30))
    item_id = f"msg_{response_id[5:]}"
    text, tokens, cached = "", 0, 0

    def event(kind: str, **fields: Any) -> bytes:
        return sse({**fields, "sequence_number": next(sequence), "type": kind})

    try:
        yield event("response.created", response=start)
        yield event("response.in_progress", response=start)
        yield event("response.output_item.added", output_index=0,
                    item={**message_item(response_id, "", "in_progress"), "content": []})
        part: dict[str, Any] = {"type": "output_text", "text": "", "annotations": [], "logprobs": None}
        yield event("response.content_part.added", item_id=item_id, output_index=0,
                    content_index=0, part=part)
        while True:
            token = await generation.queue.get()
            if tokens == 0:
                cached = token.num_cached_tokens
            text, tokens = text + token.delta_text, token.num_output_tokens
            yield event("response.output_text.delta", item_id=item_id, output_index=0,
                        content_index=0, delta=token.delta_text, logprobs=[])
            if token.finish_reason is not None:
                break
        yield event("response.output_text.done", item_id=item_id, output_index=0,
                    content_index=0, text=text, logprobs=[])
        yield event("response.content_part.done", item_id=item_id, output_index=0,
                    content_index=0, part={**part, "text": text})
        yield event("response.output_item.done", output_index=0,
                    item=message_item(response_id, text, "completed"))
        usage = response_usage(len(generation.prompt_token_ids), tokens, cached)
        yield event("response.completed", response=finished(text, usage))
    finally:
        runtime.abort(generation)
