"""``POST /v1/completions`` of the simulator.

The prompt forms vLLM takes (``str``, ``[str]``, ``[int]``, ``[[int]]``),
``n`` choices per prompt, ``echo``, ``logprobs`` (``engine.sim.logprobs``)
and ``response_format`` / ``structured_outputs`` (JSON from the schema, as
in chat). ``echo`` with ``max_tokens: 0`` returns the prompt alone (with its
logprobs: how lm-eval scores log-likelihoods); as vLLM does, the engine
still runs the request for one token, which ``usage.completion_tokens``
counts and the text leaves out, and ``finish_reason`` is that token's.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse

from engine.sim import responses
from engine.sim.answers import parse_output_rules, plan_answer
from engine.sim.logprobs import CompletionLogprobs, TokenLogprob, prompt_items, token_logprob
from engine.sim.protocol import Prompt, SamplingRequest, check_length, parse_prompts, parse_sampling
from engine.sim.request import TokenEvent
from engine.sim.route_io import collect_events, json_response, output_spec, read_json
from engine.sim.runtime import Generation, SimRuntime, new_request_id
from engine.sim.textgen import choice_key, prompt_seed


@dataclass
class PromptEcho:
    """What ``echo`` puts before a prompt's choices: its text and scored tokens."""

    text: str
    items: list[TokenLogprob | str] = field(default_factory=list)


@dataclass
class CompletionChoice:
    key: str
    echo: PromptEcho | None
    echo_only: bool
    logprobs: CompletionLogprobs | None
    text: str = ""
    items: list[TokenLogprob | str] = field(default_factory=list)
    num_tokens: int = 0
    finish_reason: str | None = None
    stop_reason: str | None = None
    echoed: bool = False

    def feed(self, event: TokenEvent) -> tuple[str, list[TokenLogprob | str]]:
        """Take one token: the text and scored tokens it adds to the choice."""
        self.num_tokens = event.num_output_tokens
        if event.finish_reason is not None:
            self.finish_reason, self.stop_reason = event.finish_reason, event.stop_reason
        text, items = "", []
        if self.echo is not None and not self.echoed:
            self.echoed = True
            text, items = self.echo.text, list(self.echo.items)
        if not self.echo_only:
            text += event.delta_text
            if self.logprobs is not None:
                items.append(token_logprob(self.key, event.num_output_tokens - 1,
                                           event.token_text, self.logprobs.count))
        self.text += text
        self.items += items
        return text, items


async def _echoes(
    runtime: SimRuntime, prompts: Sequence[Prompt], token_lists: Sequence[list[int]],
    logprobs: int | None,
) -> list[PromptEcho]:
    out = []
    for prompt, ids in zip(prompts, token_lists):
        text = prompt if isinstance(prompt, str) else await runtime.decode(prompt)
        items = (prompt_items(str(prompt_seed(ids)), await runtime.token_texts(ids), logprobs)
                 if logprobs is not None else [])
        out.append(PromptEcho(text, items))
    return out


def build_completion_router(runtime: SimRuntime) -> APIRouter:
    router = APIRouter()
    config = runtime.config
    model_name = config.served_model_name

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        timing = runtime.timings.received(request.headers.get("x-request-id"))
        body, _ = await read_json(request)
        sampling = parse_sampling(body, chat=False)
        prompts = parse_prompts(body)
        rules = parse_output_rules(body)
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
        echo_only = sampling.echo and sampling.max_tokens == 0
        limits = [check_length(len(ids), sampling.max_tokens, config.max_model_len)
                  for ids in token_lists]
        echoes = (await _echoes(runtime, prompts, token_lists, sampling.logprobs)
                  if sampling.echo else None)
        n = sampling.n
        choices: list[CompletionChoice] = []
        scripts: list[list[tuple[str, ...] | None]] = []
        for position, ids in enumerate(token_lists):
            keys = [choice_key(sampling.seed, ids, index, config.seed) for index in range(n)]
            scripts.append([plan_answer(rules, [], random.Random(f"plan:{key}")).script
                            for key in keys])
            for key in keys:
                choices.append(CompletionChoice(
                    key, echoes[position] if echoes is not None else None, echo_only,
                    CompletionLogprobs(sampling.logprobs) if sampling.logprobs is not None
                    else None))
        request_id = "cmpl-" + new_request_id(request.headers.get("x-request-id"))
        created = int(time.time())
        queue: asyncio.Queue[TokenEvent] = asyncio.Queue()
        generations = [
            runtime.submit(
                f"{request_id}-{i}",
                ids,
                output_spec(sampling, 1 if echo_only else limit),
                n,
                sampling.cache_salt,
                queue,
                i * n,
                scripts=scripts[i],
            )
            for i, (ids, limit) in enumerate(zip(token_lists, limits))
        ]
        generations[0].timing = timing
        prompt_tokens = [len(ids) for ids in token_lists]
        if sampling.stream:
            stream = _stream_completion(runtime, generations, sampling, choices, request_id,
                                        created, model_name, prompt_tokens)
            return StreamingResponse(stream, media_type="text/event-stream")

        def feed(event: TokenEvent) -> None:
            choices[event.index].feed(event)

        cached = await collect_events(request, runtime, generations, len(choices), feed)
        if cached is None:
            return json_response({"error": "client disconnected"}, 499)
        out = [
            responses.completion_choice(
                index, choice.text, choice.finish_reason, choice.stop_reason,
                choice.logprobs.shape(choice.items) if choice.logprobs is not None else None,
            )
            for index, choice in enumerate(choices)
        ]
        cached_total = sum(cached.get(i * n, 0) for i in range(len(prompts)))
        usage = responses.usage(
            sum(prompt_tokens), sum(c.num_tokens for c in choices), cached_total
        )
        return json_response(responses.completion(request_id, created, model_name, out, usage))

    return router


async def _stream_completion(
    runtime: SimRuntime,
    generations: list[Generation],
    sampling: SamplingRequest,
    choices: list[CompletionChoice],
    request_id: str,
    created: int,
    model: str,
    prompt_tokens: list[int],
) -> AsyncIterator[bytes]:
    n = sampling.n
    cached: dict[int, int] = {}
    finished = 0
    queue = generations[0].queue
    try:
        while finished < len(choices):
            event = await queue.get()
            if generations[0].timing is not None:
                generations[0].timing.token()
            prompt_index = event.index // n
            cached.setdefault(prompt_index, event.num_cached_tokens)
            choice = choices[event.index]
            text, items = choice.feed(event)
            extra = None
            if sampling.continuous_usage_stats:
                extra = responses.continuous_usage(prompt_tokens[prompt_index], choice.num_tokens)
            logprobs = choice.logprobs.shape(items) if choice.logprobs is not None else None
            yield responses.completion_chunk(
                request_id, created, model, event.index, text, event.finish_reason,
                event.stop_reason, extra, logprobs,
            )
            if event.finish_reason is not None:
                finished += 1
        if sampling.include_usage:
            usage = responses.usage(sum(prompt_tokens), sum(c.num_tokens for c in choices),
                                    sum(cached.values()))
            yield responses.usage_chunk(request_id, created, model, "text_completion", usage)
        yield responses.SSE_DONE
    finally:
        for generation in generations:
            runtime.abort(generation)
