"""``POST /v1/chat/completions`` of the simulator.

Order of checks follows vLLM: body shape (400 "Bad Request", tools and
``tool_choice`` included), model (404), rendering/tokenizing (400), context
length (400), then the request is queued in the engine. Each choice's
answer is planned first (``engine.sim.answers``: text, JSON for
``response_format``, or tool calls), then generated one token at a time; a
stream sends vLLM's chunks as the engine samples them
(``engine.sim.chat_choice``), a plain request waits for every choice.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from engine.sim import responses
from engine.sim.answers import AnswerPlan, OutputRules, parse_output_rules, plan_answer
from engine.sim.chat_choice import ChatChoice
from engine.sim.protocol import (
    SamplingRequest,
    check_length,
    parse_sampling,
    refuse_request_template,
    require_messages,
    validation_error,
)
from engine.sim.route_io import collect_events, json_response, output_spec, read_json
from engine.sim.runtime import Generation, SimRuntime, new_request_id
from engine.sim.textgen import choice_key
from engine.sim.timings import RequestTiming


def plan_choices(
    rules: OutputRules, messages: Sequence[Any], sampling: SamplingRequest,
    prompt: Sequence[int], server_seed: int,
) -> tuple[list[AnswerPlan], list[str]]:
    """Each choice's plan and its seed key (for its logprobs)."""
    keys = [choice_key(sampling.seed, prompt, index, server_seed) for index in range(sampling.n)]
    plans = [plan_answer(rules, messages, random.Random(f"plan:{key}")) for key in keys]
    return plans, keys


def build_chat_router(runtime: SimRuntime) -> APIRouter:
    router = APIRouter()

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        timing = runtime.timings.received(request.headers.get("x-request-id"))
        body, size = await read_json(request)
        return await answer_chat(runtime, request, body, size, timing)

    @router.post("/v1/chat/completions/batch")
    async def chat_batch(request: Request) -> Response:
        """vLLM 0.32's batch of chats: ``messages`` a list of conversations, one choice
        each (index = its place), usage summed, never streamed; the first refusal is the
        answer."""
        body, size = await read_json(request)
        batch = body.get("messages")
        if not isinstance(batch, list) or not batch:
            raise validation_error(("messages",), "Input should be a valid list", batch,
                                   "list_type")
        for index, conversation in enumerate(batch):
            if not isinstance(conversation, list) or not conversation:
                raise validation_error(("messages", index), "Input should be a valid list",
                                       conversation, "list_type")
        shared = {k: v for k, v in body.items() if k not in ("messages", "stream",
                                                             "stream_options")}
        answers = await asyncio.gather(*(
            answer_chat(runtime, request, {**shared, "messages": conversation}, size)
            for conversation in batch))
        for answer in answers:
            if answer.status_code != 200:
                return answer
        payloads = [orjson.loads(bytes(answer.body)) for answer in answers]
        usage = {key: sum(p["usage"][key] for p in payloads)
                 for key in ("prompt_tokens", "total_tokens", "completion_tokens")}
        return json_response({
            **payloads[0],
            "choices": [{**p["choices"][0], "index": i} for i, p in enumerate(payloads)],
            "usage": {**usage, "prompt_tokens_details": None},
        })

    return router


async def answer_chat(runtime: SimRuntime, request: Request, body: dict[str, Any], size: int,
                      timing: RequestTiming | None = None) -> Response:
    """A chat request's answer (a stream or a JSON body), as ``/v1/chat/completions`` gives
    it; the Anthropic Messages API (``engine.sim.anthropic_route``) answers through it."""
    config = runtime.config
    model_name = config.served_model_name
    messages = require_messages(body)
    sampling = parse_sampling(body, chat=True)
    rules = parse_output_rules(body)  # refused before the model is looked at, as in vLLM
    runtime.check_model(sampling.model)
    refuse_request_template(body)
    prompt = await runtime.chat_token_ids(
        body, size, bool(body.get("add_special_tokens", False))
    )
    max_tokens = check_length(len(prompt), sampling.max_tokens, config.max_model_len)
    plans, keys = plan_choices(rules, messages, sampling, prompt, config.seed)
    choices = [ChatChoice(index, plan, sampling.logprobs, key)
               for index, (plan, key) in enumerate(zip(plans, keys))]
    request_id = "chatcmpl-" + new_request_id(request.headers.get("x-request-id"))
    created = int(time.time())
    generation = runtime.submit(
        request_id, prompt, output_spec(sampling, max_tokens), sampling.n,
        sampling.cache_salt, scripts=[plan.script for plan in plans],
    )
    generation.timing = timing
    if sampling.stream:
        role = (
            "assistant"
            if body.get("add_generation_prompt", True)
            else messages[-1]["role"]
        )
        stream = _stream_chat(
            runtime, generation, sampling, choices, request_id, created, model_name, role
        )
        return StreamingResponse(stream, media_type="text/event-stream")

    def feed(event: Any) -> None:
        choices[event.index].feed(event)

    cached = await collect_events(request, runtime, [generation], sampling.n, feed)
    if cached is None:
        return json_response({"error": "client disconnected"}, 499)
    payload = responses.chat_completion(
        request_id,
        created,
        model_name,
        [
            responses.chat_choice(
                choice.index, choice.message(), choice.reported_finish(),
                choice.stop_reason, choice.message_logprobs(),
            )
            for choice in choices
        ],
        responses.usage(
            len(prompt), sum(choice.num_tokens for choice in choices), cached.get(0, 0),
            responses.created_cache_tokens(len(prompt), cached.get(0, 0), config.block_size),
        ),
    )
    return json_response(payload)


async def _stream_chat(
    runtime: SimRuntime,
    generation: Generation,
    sampling: SamplingRequest,
    choices: list[ChatChoice],
    request_id: str,
    created: int,
    model: str,
    role: str,
) -> AsyncIterator[bytes]:
    n = sampling.n
    prompt_tokens = len(generation.prompt_token_ids)
    finished = 0
    cached: int | None = None
    try:
        while finished < n:
            event = await generation.queue.get()
            if generation.timing is not None:
                generation.timing.token()
            if cached is None:
                cached = event.num_cached_tokens
                for index in range(n):
                    extra = (
                        responses.continuous_usage(prompt_tokens, 0)
                        if sampling.continuous_usage_stats
                        else None
                    )
                    yield responses.chat_chunk(
                        request_id, created, model, responses.chat_role_choice(index, role),
                        extra, first=True,
                    )
            choice = choices[event.index]
            delta = choice.feed(event)
            finishing = event.finish_reason is not None
            if finishing:
                finished += 1
            if delta is None:
                continue
            payload = responses.chat_delta_choice(
                event.index,
                delta,
                choice.reported_finish() if finishing else None,
                event.stop_reason,
                choice.stream_logprobs(),
            )
            extra = (
                responses.continuous_usage(prompt_tokens, choice.num_tokens)
                if sampling.continuous_usage_stats
                else None
            )
            yield responses.chat_chunk(
                request_id, created, model, payload, extra,
                fingerprint=finishing and not sampling.include_usage,
            )
        if sampling.include_usage:
            usage = responses.usage(
                prompt_tokens, sum(choice.num_tokens for choice in choices), cached or 0,
                responses.created_cache_tokens(prompt_tokens, cached or 0,
                                               runtime.config.block_size),
            )
            yield responses.usage_chunk(request_id, created, model, "chat.completion.chunk", usage)
        yield responses.SSE_DONE
    finally:
        runtime.abort(generation)
