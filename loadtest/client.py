"""One streamed chat or completions request through the official ``openai`` client, measured.

A call with a ``prompt`` goes to ``/v1/completions`` (``completions.create``),
its text read from ``choices[0].text``; any other call goes to
``/v1/chat/completions`` with its ``messages`` (and ``tools``), its text read
from ``choices[0].delta.content``. Either is sent with ``stream=True`` and
``stream_options={"include_usage": True}`` through ``with_raw_response`` so
the response headers (the ``x-prefixgate-replica`` that names the replica a
gateway chose) are read before the stream is consumed. Times come from the injected monotonic clock:

* ``ttft``: send to the first chunk carrying content text;
* ``e2e``: send to the end of the stream;
* ``tpot``: ``(e2e - ttft) / (completion_tokens - 1)`` when more than one
  token was generated.

Token counts and ``cached_tokens`` come from the final usage chunk
(``usage.prompt_tokens_details.cached_tokens``); when a server sends no usage
the completion count falls back to the number of content chunks and
``usage_reported`` is false. Every failure — HTTP status, connection error,
time-out, a stream broken half-way — becomes the record's ``error`` text;
nothing is raised to the caller.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai

REPLICA_HEADER = "x-prefixgate-replica"


@dataclass(frozen=True, slots=True)
class RequestRecord:
    conversation: str
    group: str
    turn: int
    sent_at: float
    """Seconds since the start of the run."""
    ttft: float | None = None
    tpot: float | None = None
    e2e: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    usage_reported: bool = False
    replica: str | None = None
    error: str | None = None
    request_id: str | None = None
    """The ``X-Request-Id`` sent, when the client sets one (the lean client does)."""
    started: float | None = None
    """The clock reading at send (``sent_at`` is relative to the run's start)."""

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True, slots=True)
class ChatCall:
    """What to send: the conversation so far and how long an answer to ask for."""

    conversation: str
    group: str
    turn: int
    messages: tuple[dict[str, Any], ...]
    max_tokens: int
    ignore_eos: bool
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | None = None
    prompt: str | None = None
    """Set: a completions request with this text (``messages`` unused)."""

    @property
    def completions(self) -> bool:
        return self.prompt is not None

    def body(self, model: str) -> dict[str, Any]:
        """The request body's content fields (no streaming or sampling options)."""
        if self.prompt is not None:
            return {"model": model, "prompt": self.prompt}
        body: dict[str, Any] = {"model": model, "messages": list(self.messages)}
        if self.tools:
            body["tools"] = list(self.tools)
        if self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        return body


@dataclass(frozen=True, slots=True)
class ChatOutcome:
    record: RequestRecord
    answer: str


def _short(exc: BaseException) -> str:
    if isinstance(exc, openai.APIStatusError):
        message = exc.message if isinstance(exc.message, str) else repr(exc.message)
        return f"HTTP {exc.status_code}: {message[:200]}"
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        return f"connection error: {type(cause).__name__ if cause else exc.message}"
    return f"{type(exc).__name__}: {str(exc)[:200]}"


async def stream_chat(
    client: openai.AsyncOpenAI,
    model: str,
    call: ChatCall,
    clock: Callable[[], float],
    run_start: float,
) -> ChatOutcome:
    """Send one streamed request and measure it; never raises for server errors."""
    extra: dict[str, Any] = {"ignore_eos": True} if call.ignore_eos else {}
    start = clock()
    first: float | None = None
    pieces: list[str] = []
    chunks_with_text = 0
    usage: Any = None
    replica: str | None = None
    error: str | None = None
    try:
        api = client.completions if call.completions else client.chat.completions
        raw = await api.with_raw_response.create(  # type: ignore[call-overload]
            **call.body(model),
            max_tokens=call.max_tokens,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra or None,
        )
        replica = raw.headers.get(REPLICA_HEADER)
        parsed = raw.parse()
        # parse() is a coroutine in some openai releases and returns the stream in others
        stream = await parsed if inspect.isawaitable(parsed) else parsed
        async for chunk in stream:
            if chunk.choices:
                choice = chunk.choices[0]
                text = choice.text if call.completions else choice.delta.content
                if text:
                    if first is None:
                        first = clock()
                    pieces.append(text)
                    chunks_with_text += 1
            if chunk.usage is not None:
                usage = chunk.usage
    except Exception as exc:  # noqa: BLE001 - every failure is a measured outcome
        error = _short(exc)
    end = clock()
    completion = getattr(usage, "completion_tokens", None)
    details = getattr(usage, "prompt_tokens_details", None)
    record = measured(call, run_start, start, first, end, error, replica,
                      completion if completion is not None else chunks_with_text,
                      getattr(usage, "prompt_tokens", None),
                      getattr(details, "cached_tokens", None), usage is not None)
    return ChatOutcome(record, "".join(pieces))


def measured(call: ChatCall, run_start: float, start: float, first: float | None, end: float,
             error: str | None, replica: str | None, completion: int,
             prompt_tokens: int | None, cached_tokens: int | None,
             usage_reported: bool, request_id: str | None = None) -> RequestRecord:
    """The record of one streamed request from its clock readings and usage."""
    ttft = None if first is None else first - start
    e2e = end - start if error is None else None
    tpot = None
    if ttft is not None and e2e is not None and completion > 1:
        tpot = (e2e - ttft) / (completion - 1)
    if error is None and first is None and call.max_tokens > 0:
        error = "stream ended without content"
    return RequestRecord(
        conversation=call.conversation, group=call.group, turn=call.turn,
        sent_at=start - run_start, ttft=ttft, tpot=tpot, e2e=e2e,
        prompt_tokens=prompt_tokens, completion_tokens=completion,
        cached_tokens=cached_tokens, usage_reported=usage_reported,
        replica=replica, error=error, request_id=request_id, started=start)
