"""One streamed ``/v1/completions`` request, timed token by token.

The calibration talks raw HTTP (httpx) to ``/v1/completions`` rather than
going through a chat template, so a prompt of ``n`` filler words is exactly
``n`` prompt tokens on the Qwen3 tokenizer (see ``loadtest.workloads.text``)
on both vLLM and the simulator. The request asks for
``stream_options = {"include_usage": true, "continuous_usage_stats": true}``:
every chunk then carries ``usage.completion_tokens`` so far, and both vLLM
and the simulator send one chunk per engine step that produced a token. That
count, not the chunk's text, says how many tokens arrived: with dummy
weights a token may decode to no text at all.

Measured, with the injected monotonic clock:

* ``ttft``: request sent to the first chunk whose ``completion_tokens`` >= 1;
* ``tpot``: (arrival of the last token - arrival of the first) divided by the
  tokens that arrived after the first chunk, when there are any;
* ``cached_tokens``: the final usage chunk's
  ``prompt_tokens_details.cached_tokens`` (vLLM needs
  ``--enable-prompt-tokens-details``; 0 when absent).

A non-200 answer, a broken stream or one without tokens raises
:class:`ProbeError`: a calibration with holes in it would fit nonsense.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx


class ProbeError(RuntimeError):
    """A probe request failed; calibration stops rather than fit partial data."""


@dataclass(frozen=True, slots=True)
class CompletionCall:
    """What to send: raw prompt text and how many tokens to ask for."""

    prompt: str
    max_tokens: int
    ignore_eos: bool = True


@dataclass(frozen=True, slots=True)
class StreamTiming:
    """What one streamed request measured (seconds)."""

    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    ttft: float
    tpot: float | None


def request_body(model: str, call: CompletionCall) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": call.prompt,
        "max_tokens": call.max_tokens,
        "temperature": 0.0,
        "ignore_eos": call.ignore_eos,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


async def timed_completion(
    client: httpx.AsyncClient,
    base_url: str,
    model: str,
    call: CompletionCall,
    clock: Callable[[], float],
) -> StreamTiming:
    """Send ``call`` streamed and time its tokens; raises :class:`ProbeError` on failure."""
    start = clock()
    first_at: float | None = None
    tokens_at_first = 0
    last_at = start
    tokens = 0
    usage: dict[str, Any] = {}
    try:
        async with client.stream(
            "POST", f"{base_url}/v1/completions", json=request_body(model, call)
        ) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode(errors="replace")
                raise ProbeError(f"HTTP {response.status_code}: {body[:300]}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = clock()
                chunk = json.loads(line[6:])
                chunk_usage = chunk.get("usage") or {}
                if chunk_usage:
                    usage = chunk_usage
                count = int(chunk_usage.get("completion_tokens") or 0)
                if count > tokens:
                    tokens = count
                    last_at = now
                    if first_at is None:
                        first_at, tokens_at_first = now, count
    except httpx.HTTPError as exc:
        raise ProbeError(f"{type(exc).__name__}: {exc}") from exc
    if first_at is None:
        raise ProbeError("stream ended without a token")
    later_tokens = tokens - tokens_at_first
    details = usage.get("prompt_tokens_details") or {}
    return StreamTiming(
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
        completion_tokens=tokens,
        ttft=first_at - start,
        tpot=(last_at - first_at) / later_tokens if later_tokens > 0 else None,
    )
