"""What every generating route of the simulator shares: reading the body,
answering JSON, the output spec of a request, and waiting for its choices.

:func:`collect` waits for every choice of a plain (not streamed) request,
feeding each token to the route; if the client goes away first
(``http.disconnect``) the request is aborted in the engine and its blocks
are freed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import Request
from fastapi.responses import Response

from engine.sim.protocol import SamplingRequest, parse_json_object
from engine.sim.request import TokenEvent
from engine.sim.runtime import Generation, SimRuntime
from engine.sim.textgen import OutputSpec


async def read_json(request: Request) -> tuple[dict[str, Any], int]:
    raw = await request.body()
    return parse_json_object(raw, request.headers.get("content-type", "")), len(raw)


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json")


def output_spec(
    sampling: SamplingRequest, max_tokens: int, script: tuple[str, ...] | None = None
) -> OutputSpec:
    return OutputSpec(
        max_tokens=max_tokens,
        min_tokens=sampling.min_tokens,
        ignore_eos=sampling.ignore_eos,
        stop=sampling.stop,
        include_stop_str_in_output=sampling.include_stop_str_in_output,
        seed=sampling.seed,
        script=script,
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
    queue: asyncio.Queue[TokenEvent],
    choices: int,
    feed: Callable[[TokenEvent], None],
    cached: dict[int, int],
) -> None:
    remaining = choices
    while remaining:
        event = await queue.get()
        feed(event)
        cached.setdefault(event.index, event.num_cached_tokens)
        if event.finish_reason is not None:
            remaining -= 1


async def collect_events(
    request: Request,
    runtime: SimRuntime,
    generations: Sequence[Generation],
    choices: int,
    feed: Callable[[TokenEvent], None],
) -> dict[int, int] | None:
    """Feed every token of ``choices`` choices to ``feed`` until all finished;
    the cached prompt tokens by choice index, or ``None`` if the client left first."""
    cached: dict[int, int] = {}
    drain = asyncio.create_task(_drain(generations[0].queue, choices, feed, cached))
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


async def collect(
    request: Request,
    runtime: SimRuntime,
    generations: Sequence[Generation],
    choices: list[ChoiceResult],
) -> dict[int, int] | None:
    """Wait for every choice's text; ``None`` if the client disconnected first."""

    def feed(event: TokenEvent) -> None:
        choice = choices[event.index]
        choice.text += event.delta_text
        choice.num_tokens = event.num_output_tokens
        if event.finish_reason is not None:
            choice.finish_reason, choice.stop_reason = event.finish_reason, event.stop_reason

    return await collect_events(request, runtime, generations, len(choices), feed)
