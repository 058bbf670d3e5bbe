"""Streamed chat and completions requests, measured: one reading, two transports.

A call with a ``prompt`` goes to ``/v1/completions``, its text read from
``choices[0].text``; any other call goes to ``/v1/chat/completions`` with its
``messages`` (and ``tools``), its text read from ``choices[0].delta.content``.
Either is sent with ``stream=True`` and ``stream_options={"include_usage":
True}`` (plus ``"continuous_usage_stats": True`` when the call asks for it:
every chunk then carries the completion tokens so far). Times come from the
injected monotonic clock, read only when a figure needs it:

* ``ttft``: send to the first token: the first chunk carrying content text
  or, in a continuous-usage stream, the first whose token count is >= 1
  (with dummy weights a token may decode to no text at all);
* ``e2e``: send to the end of the stream;
* ``tpot``: ``(e2e - ttft) / (completion_tokens - 1)`` when more than one
  token was generated;
* ``token_tpot`` (continuous usage only): from the first token's arrival to
  the last's, divided by the tokens that arrived after the first chunk.

Token counts and ``cached_tokens`` come from the last usage seen
(``usage.prompt_tokens_details.cached_tokens``); when a server sends no usage
the completion count falls back to the number of content chunks and
``usage_reported`` is false. Every failure — HTTP status, connection error,
time-out, a stream broken half-way — becomes the record's ``error`` text;
nothing is raised to the caller.

Two transports behind one interface (:class:`StreamClient`), sharing the
reading (:class:`StreamReading`) and the record:

* :class:`OpenAIClient`, the official ``openai`` client, through
  ``with_raw_response`` so the response headers (the ``x-prefixgate-replica``
  that names the replica a gateway chose) are read before the stream. It
  builds a pydantic object per chunk and keeps the whole answer: the one for
  workloads whose next prompt holds it, and for tests of the gateway.
* :class:`LeanClient`, aiohttp and orjson: the same request body, but an SSE
  line is decoded only while it can matter (until the first token, and for
  usage), about 5x less CPU — on a 2-core machine the official client makes
  the load generator the bottleneck long before a gateway is. It sends a
  fresh ``x-request-id`` per request (a gateway forwards it, so a simulated
  replica's timing log can be joined to the record) and keeps only the text
  it decoded: a measuring instrument, not a way to hold a conversation.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
import openai
import orjson

REPLICA_HEADER = "x-prefixgate-replica"
MATCHED_HEADER = "x-prefixgate-matched-tokens"


def matched_of(headers: Mapping[str, str]) -> int | None:
    value = headers.get(MATCHED_HEADER)
    return int(value) if value is not None and value.isdigit() else None

Clock = Callable[[], float]


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
    matched_tokens: int | None = None
    """``x-prefixgate-matched-tokens``: what the gateway predicted the replica holds."""
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
    temperature: float | None = None
    continuous_usage: bool = False
    """Ask for usage in every chunk (vLLM's ``continuous_usage_stats``)."""

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

    def request(self, model: str) -> dict[str, Any]:
        """The whole streamed request body, as both transports send it."""
        options: dict[str, Any] = {"include_usage": True}
        if self.continuous_usage:
            options["continuous_usage_stats"] = True
        body = {**self.body(model), "max_tokens": self.max_tokens, "stream": True,
                "stream_options": options}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body


@dataclass(frozen=True, slots=True)
class ChatOutcome:
    record: RequestRecord
    answer: str
    token_tpot: float | None = None


class StreamReading:
    """What one stream delivered and when, chunk by chunk."""

    def __init__(self, call: ChatCall, clock: Clock, run_start: float) -> None:
        self.call, self.clock, self.run_start = call, clock, run_start
        self.start = clock()
        self.first: float | None = None
        self.pieces: list[str] = []
        self.content_chunks = 0
        self.usage: Mapping[str, Any] | None = None
        self.tokens = 0
        """The highest running token count a chunk carried (continuous usage)."""
        self.tokens_at_first = 0
        self.last_token = 0.0

    def chunk(self, text: str | None, usage: Mapping[str, Any] | None, has_choice: bool) -> None:
        """One decoded chunk: its choice's text, its usage, whether it had a choice at all."""
        if usage:
            self.usage = usage
        if text:
            self.pieces.append(text)
            self.content_chunks += 1
        # The usage-only chunk at the end repeats the count: no token arrives with it.
        count = int(usage.get("completion_tokens") or 0) if usage and has_choice else 0
        first = self.first is None and (bool(text) or count > 0)
        if not first and count <= self.tokens:
            return
        now = self.clock()
        if first:
            self.first, self.tokens_at_first = now, count
        if count > self.tokens:
            self.tokens, self.last_token = count, now

    def sse_line(self, line: bytes) -> None:
        """One line of the raw stream, decoded only while it can matter."""
        if not line.startswith(b"data: {"):
            return
        if self.first is not None and b'"usage":{' not in line and b'"usage": {' not in line:
            self.content_chunks += 1  # past the first token, a line without usage is content
            return
        chunk = orjson.loads(line[6:])
        choices = chunk.get("choices") or ()
        text = None
        if choices:
            choice = choices[0]
            text = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get(
                "content")
        self.chunk(text, chunk.get("usage"), bool(choices))

    def outcome(self, error: str | None, replica: str | None,
                request_id: str | None = None, matched: int | None = None) -> ChatOutcome:
        """The record of the request, now that its stream is over (or failed)."""
        end = self.clock()
        call, start, usage = self.call, self.start, self.usage or {}
        completion = usage.get("completion_tokens")
        if completion is None:
            completion = self.content_chunks
        details = usage.get("prompt_tokens_details") or {}
        ttft = None if self.first is None else self.first - start
        e2e = end - start if error is None else None
        tpot = None
        if ttft is not None and e2e is not None and completion > 1:
            tpot = (e2e - ttft) / (completion - 1)
        if error is None and self.first is None and call.max_tokens > 0:
            error = "stream ended without content"
        later = self.tokens - self.tokens_at_first
        token_tpot = None
        if later > 0 and self.first is not None:
            token_tpot = (self.last_token - self.first) / later
        record = RequestRecord(
            conversation=call.conversation, group=call.group, turn=call.turn,
            sent_at=start - self.run_start, ttft=ttft, tpot=tpot, e2e=e2e,
            prompt_tokens=usage.get("prompt_tokens"), completion_tokens=completion,
            cached_tokens=details.get("cached_tokens"), usage_reported=bool(self.usage),
            replica=replica, matched_tokens=matched, error=error, request_id=request_id,
            started=start)
        return ChatOutcome(record, "".join(self.pieces), token_tpot)


class StreamClient(Protocol):
    async def stream_chat(self, model: str, call: ChatCall, clock: Clock,
                          run_start: float) -> ChatOutcome:
        """Send one streamed request and measure it; never raises for server errors."""
        ...

    async def close(self) -> None:
        ...


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


class OpenAIClient:
    """The official ``openai`` client as a :class:`StreamClient`."""

    def __init__(self, api: openai.AsyncOpenAI) -> None:
        self.api = api

    @classmethod
    def connect(cls, base_url: str, api_key: str, timeout: float) -> OpenAIClient:
        # The client's own connection pool (1000 connections, 100 kept alive) is
        # enough for the concurrencies used here; no retries: a failure is a result.
        return cls(openai.AsyncOpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=api_key,
                                      max_retries=0, timeout=timeout))

    async def close(self) -> None:
        await self.api.close()

    async def stream_chat(self, model: str, call: ChatCall, clock: Clock,
                          run_start: float) -> ChatOutcome:
        body = call.request(model)
        extra = {"ignore_eos": True} if body.pop("ignore_eos", False) else None
        reading = StreamReading(call, clock, run_start)
        replica = error = matched = None
        try:
            api = self.api.completions if call.completions else self.api.chat.completions
            raw = await api.with_raw_response.create(**body, extra_body=extra)
            replica, matched = raw.headers.get(REPLICA_HEADER), matched_of(raw.headers)
            parsed = raw.parse()
            # parse() is a coroutine in some openai releases and returns the stream in others
            stream = await parsed if inspect.isawaitable(parsed) else parsed
            async for chunk in stream:
                choice = chunk.choices[0] if chunk.choices else None
                text = None
                if choice is not None:
                    text = choice.text if call.completions else choice.delta.content
                usage = chunk.usage.model_dump() if chunk.usage is not None else None
                reading.chunk(text, usage, choice is not None)
        except Exception as exc:  # noqa: BLE001 - every failure is a measured outcome
            error = _short(exc)
        return reading.outcome(error, replica, matched=matched)


class LeanClient:
    """aiohttp and a lazy SSE reader as a :class:`StreamClient` (see the module doc)."""

    def __init__(self, base_url: str, api_key: str, timeout: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.headers = {"authorization": f"Bearer {api_key}",
                        "content-type": "application/json"}
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=self.timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def stream_chat(self, model: str, call: ChatCall, clock: Clock,
                          run_start: float) -> ChatOutcome:
        path = "/v1/completions" if call.completions else "/v1/chat/completions"
        payload = orjson.dumps(call.request(model))
        request_id = uuid.uuid4().hex
        headers = {**self.headers, "x-request-id": request_id}
        reading = StreamReading(call, clock, run_start)
        replica = error = matched = None
        try:
            async with self._client().post(self.base_url + path, data=payload,
                                           headers=headers) as response:
                replica = response.headers.get(REPLICA_HEADER)
                matched = matched_of(response.headers)
                if response.status != 200:
                    error = f"HTTP {response.status}: {(await response.text())[:200]}"
                else:
                    async for line in response.content:
                        reading.sse_line(line)
        except Exception as exc:  # noqa: BLE001 - every failure is a measured outcome
            error = f"{type(exc).__name__}: {str(exc)[:200]}"
        return reading.outcome(error, replica, request_id, matched)
