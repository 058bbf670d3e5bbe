"""``POST /v1/chat/completions`` and ``POST /v1/completions`` of the simulator.

Order of checks follows vLLM: body shape (400 "Bad Request"), model (404),
rendering/tokenizing (400), context length (400), then the request is
queued in the engine. A stream then sends vLLM's chunks as the engine
samples tokens; a plain request waits for every choice. If the client goes
away (stream cancelled by Starlette, or ``http.disconnect`` while waiting)
the request is aborted in the engine and its blocks are freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from engine.sim import responses
from engine.sim.protocol import (
    Prompt,
    SamplingRequest,
    check_length,
    parse_json_object,
    parse_prompts,
    parse_sampling,
    refuse_request_template,
    require_messages,
)
from engine.sim.request import TokenEvent
from engine.sim.runtime import Generation, SimRuntime, new_request_id
from engine.sim.textgen import OutputSpec


async def read_json(request: Request) -> tuple[dict[str, Any], int]:
    raw = await request.body()
    return parse_json_object(raw, request.headers.get("content-type", "")), len(raw)


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def output_spec(sampling: SamplingRequest, max_tokens: int) -> OutputSpec:
    return OutputSpec(
        max_tokens=max_tokens,
        min_tokens=sampling.min_tokens,
        ignore_eos=sampling.ignore_eos,
        stop=sampling.stop,
        include_stop_str_in_output=sampling.include_stop_str_in_output,
        seed=sampling.seed,
    )


@dataclass
class ChoiceResult:
    text: str = ""
    num_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | None = None


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def _drain(
    queue: asyncio.Queue[TokenEvent], choices: list[ChoiceResult], cached: dict[int, int]
) -> None:
    remaining = len(choices)
    while remaining:
        event = await queue.get()
        choice = choices[event.index]
        choice.text += event.delta_text
        choice.num_tokens = event.num_output_tokens
        cached.setdefault(event.index, event.num_cached_tokens)
        if event.finish_reason is not None:
            choice.finish_reason, choice.stop_reason = event.finish_reason, event.stop_reason
            remaining -= 1


async def collect(
    request: Request,
    runtime: SimRuntime,
    generations: Sequence[Generation],
    choices: list[ChoiceResult],
) -> dict[int, int] | None:
    """Wait for every choice; ``None`` if the client disconnected first."""
    cached: dict[int, int] = {}
    drain = asyncio.create_task(_drain(generations[0].queue, choices, cached))
    watcher = asyncio.create_task(_wait_disconnect(request))
    try:
        done, _ = await asyncio.wait({drain, watcher}, return_when=asyncio.FIRST_COMPLETED)
        return cached if drain in done else None
    finally:
        for task in (drain, watcher):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for generation in generations:
            runtime.abort(generation)


def build_openai_router(runtime: SimRuntime) -> APIRouter:
    router = APIRouter()
    config = runtime.config
    model_name = config.served_model_name

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        timing = runtime.timings.received(request.headers.get("x-request-id"))
        body, size = await read_json(request)
        require_messages(body)
        sampling = parse_sampling(body, chat=True)
        runtime.check_model(sampling.model)
        refuse_request_template(body)
        prompt = await runtime.chat_token_ids(
            body, size, bool(body.get("add_special_tokens", False))
        )
        max_tokens = check_length(len(prompt), sampling.max_tokens, config.max_model_len)
        request_id = "chatcmpl-" + new_request_id(request.headers.get("x-request-id"))
        created = int(time.time())
        generation = runtime.submit(
            request_id, prompt, output_spec(sampling, max_tokens), sampling.n, sampling.cache_salt
        )
        generation.timing = timing
        if sampling.stream:
            role = (
                "assistant"
                if body.get("add_generation_prompt", True)
                else body["messages"][-1]["role"]
            )
            stream = _stream_chat(
                runtime, generation, sampling, request_id, created, model_name, role
            )
            return StreamingResponse(stream, media_type="text/event-stream")
        choices = [ChoiceResult() for _ in range(sampling.n)]
        cached = await collect(request, runtime, [generation], choices)
        if cached is None:
            return json_response({"error": "client disconnected"}, 499)
        completion_tokens = sum(choice.num_tokens for choice in choices)
        payload = responses.chat_completion(
            request_id,
            created,
            model_name,
            [
                responses.chat_choice(
                    index, choice.text, choice.finish_reason or "stop", choice.stop_reason
                )
                for index, choice in enumerate(choices)
            ],
            responses.usage(len(prompt), completion_tokens, cached.get(0, 0)),
        )
        return json_response(payload)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        timing = runtime.timings.received(request.headers.get("x-request-id"))
        body, _ = await read_json(request)
        sampling = parse_sampling(body, chat=False)
        prompts = parse_prompts(body)
        runtime.check_model(sampling.model)
        add_special = bool(body.get("add_special_tokens", True))
        token_lists: list[list[int]] = []
        for prompt in prompts:
            ids = (
                await runtime.text_token_ids(prompt, add_special)
                if isinstance(prompt, str)
                else prompt
            )
            token_lists.append(ids)
        specs = [
            output_spec(sampling, check_length(len(ids), sampling.max_tokens, config.max_model_len))
            for ids in token_lists
        ]
        echo_texts = (
            [await _prompt_text(runtime, prompt) for prompt in prompts] if sampling.echo else None
        )
        request_id = "cmpl-" + new_request_id(request.headers.get("x-request-id"))
        created = int(time.time())
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        generations = [
            runtime.submit(
                f"{request_id}-{i}",
                ids,
                spec,
                sampling.n,
                sampling.cache_salt,
                queue,
                i * sampling.n,
            )
            for i, (ids, spec) in enumerate(zip(token_lists, specs))
        ]
        generations[0].timing = timing
        prompt_tokens = [len(ids) for ids in token_lists]
        if sampling.stream:
            stream = _stream_completion(
                runtime,
                generations,
                sampling,
                request_id,
                created,
                model_name,
                prompt_tokens,
                echo_texts,
            )
            return StreamingResponse(stream, media_type="text/event-stream")
        choices = [ChoiceResult() for _ in range(len(prompts) * sampling.n)]
        cached = await collect(request, runtime, generations, choices)
        if cached is None:
            return json_response({"error": "client disconnected"}, 499)
        out = []
        for index, choice in enumerate(choices):
            prefix = echo_texts[index // sampling.n] if echo_texts is not None else ""
            out.append(
                responses.completion_choice(
                    index, prefix + choice.text, choice.finish_reason, choice.stop_reason
                )
            )
        cached_total = sum(cached.get(i * sampling.n, 0) for i in range(len(prompts)))
        usage = responses.usage(
            sum(prompt_tokens), sum(c.num_tokens for c in choices), cached_total
        )
        return json_response(responses.completion(request_id, created, model_name, out, usage))

    return router


async def _prompt_text(runtime: SimRuntime, prompt: Prompt) -> str:
    return prompt if isinstance(prompt, str) else await runtime.decode(prompt)


async def _stream_chat(
    runtime: SimRuntime,
    generation: Generation,
    sampling: SamplingRequest,
    request_id: str,
    created: int,
    model: str,
    role: str,
) -> AsyncIterator[bytes]:
    n = sampling.n
    prompt_tokens = len(generation.prompt_token_ids)
    counts = [0] * n
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
                    role_choice = responses.chat_role_choice(index)
                    role_choice["delta"]["role"] = role
                    extra = (
                        responses.continuous_usage(prompt_tokens, 0)
                        if sampling.continuous_usage_stats
                        else None
                    )
                    yield responses.chat_chunk(
                        request_id, created, model, role_choice, extra, first=True
                    )
            counts[event.index] = event.num_output_tokens
            choice = responses.chat_delta_choice(
                event.index, event.delta_text, event.finish_reason, event.stop_reason
            )
            extra = (
                responses.continuous_usage(prompt_tokens, counts[event.index])
                if sampling.continuous_usage_stats
                else None
            )
            yield responses.chat_chunk(request_id, created, model, choice, extra)
            if event.finish_reason is not None:
                finished += 1
        if sampling.include_usage:
            usage = responses.usage(prompt_tokens, sum(counts), cached or 0)
            yield responses.usage_chunk(request_id, created, model, "chat.completion.chunk", usage)
        yield responses.SSE_DONE
    finally:
        runtime.abort(generation)


async def _stream_completion(
    runtime: SimRuntime,
    generations: list[Generation],
    sampling: SamplingRequest,
    request_id: str,
    created: int,
    model: str,
    prompt_tokens: list[int],
    echo_texts: list[str] | None,
) -> AsyncIterator[bytes]:
    n = sampling.n
    total = len(generations) * n
    counts = [0] * total
    echoed = [False] * total
    cached: dict[int, int] = {}
    finished = 0
    queue = generations[0].queue
    try:
        while finished < total:
            event = await queue.get()
            if generations[0].timing is not None:
                generations[0].timing.token()
            prompt_index = event.index // n
            cached.setdefault(prompt_index, event.num_cached_tokens)
            counts[event.index] = event.num_output_tokens
            text = event.delta_text
            if echo_texts is not None and not echoed[event.index]:
                text, echoed[event.index] = echo_texts[prompt_index] + text, True
            extra = None
            if sampling.continuous_usage_stats:
                extra = responses.continuous_usage(prompt_tokens[prompt_index], counts[event.index])
            yield responses.completion_chunk(
                request_id,
                created,
                model,
                event.index,
                text,
                event.finish_reason,
                event.stop_reason,
                extra,
            )
            if event.finish_reason is not None:
                finished += 1
        if sampling.include_usage:
            usage = responses.usage(sum(prompt_tokens), sum(counts), sum(cached.values()))
            yield responses.usage_chunk(request_id, created, model, "text_completion", usage)
        yield responses.SSE_DONE
    finally:
        for generation in generations:
            runtime.abort(generation)
