"""Token usage read back from a replica's answer, without re-encoding it.

Non-streaming answers are parsed once (the gateway buffers them anyway).
Streams are passed through untouched; :class:`StreamObserver` only counts
SSE events and keeps the tail of the stream, where vLLM puts the usage chunk
(``stream_options.include_usage``), and parses that one line at the end.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass

import orjson

TAIL_BYTES = 16384


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int | None = None
    """``usage.prompt_tokens_details.cached_tokens``; None when the engine did not say."""


def usage_from_object(obj: object) -> Usage | None:
    """An answer's ``usage``: chat and completions name it ``prompt_tokens`` and
    ``completion_tokens``; the Responses API ``input_tokens`` and ``output_tokens``,
    and its stream carries it in the ``response`` of its last event; the Anthropic
    Messages API counts the prompt in three parts (``input_tokens``,
    ``cache_read_input_tokens``, ``cache_creation_input_tokens``), its stream in the
    ``usage`` of its ``message_delta`` event."""
    if not isinstance(obj, dict):
        return None
    nested = obj.get("response")
    usage = obj.get("usage", nested.get("usage") if isinstance(nested, dict) else None)
    if not isinstance(usage, dict):
        return None
    if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
        # The Anthropic Messages API: input_tokens are those neither read from nor
        # written to the cache; the prompt is the three together.
        read = _count(usage, "cache_read_input_tokens")
        made = _count(usage, "cache_creation_input_tokens")
        return Usage(prompt_tokens=_count(usage, "input_tokens") + read + made,
                     completion_tokens=_count(usage, "output_tokens"), cached_tokens=read)
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=_count(usage, "prompt_tokens", "input_tokens"),
        completion_tokens=_count(usage, "completion_tokens", "output_tokens"),
        cached_tokens=int(cached) if isinstance(cached, (int, float)) else None,
    )


def _count(usage: dict[str, object], *names: str) -> int:
    """The first of ``names`` that ``usage`` has, as a count (0 when none is a number)."""
    value = next((usage[name] for name in names if name in usage), None)
    return int(value) if isinstance(value, (int, float)) else 0


def usage_from_json(body: bytes) -> Usage | None:
    try:
        return usage_from_object(orjson.loads(body))
    except orjson.JSONDecodeError:
        return None


class StreamObserver:
    """Watches an SSE stream go by: event count and the usage chunk at its end.

    A request asked to stream may still be answered with one JSON body (vLLM answers a
    batch of chats with JSON whatever ``stream`` says): its ``usage`` is then the last
    one in the body's tail."""

    def __init__(self) -> None:
        self.events = 0
        self.bytes = 0
        self._json: bool | None = None
        """Whether the answer is one JSON body (not SSE), from its first bytes."""
        # The last chunks, at least TAIL_BYTES of them once that much went by
        # (kept as a list: no copying per chunk).
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0

    def feed(self, chunk: bytes) -> None:
        if self._json is None and chunk.strip():
            self._json = chunk.lstrip()[:1] == b"{"
        self.events += chunk.count(b"data: ")
        size = len(chunk)
        self.bytes += size
        self._tail.append(chunk)
        self._tail_bytes += size
        self._trim()

    def _trim(self) -> None:
        """Drop the oldest chunks the last ``TAIL_BYTES`` do not need."""
        tail = self._tail
        while self._tail_bytes - len(tail[0]) >= TAIL_BYTES:
            self._tail_bytes -= len(tail.popleft())

    def tail(self) -> list[bytes]:
        """The last chunks seen, at least ``TAIL_BYTES`` of them once that much went by."""
        return list(self._tail)

    def merge(self, events: int, size: int, tail: list[bytes]) -> None:
        """What a tap saw of the stream after what was fed here (``EventTap``: a poured
        stream's chunks are counted in the call that writes them, not fed one by one):
        its events, bytes and last chunks, as if each had been fed."""
        if not size:
            return
        if self._json is None:  # all fed so far was blank: the first of the rest tells
            self._json = next((c.lstrip()[:1] == b"{" for c in tail if c.strip()), None)
        self.events += events
        self.bytes += size
        self._tail.extend(tail)
        self._tail_bytes += sum(map(len, tail))
        self._trim()

    def usage(self) -> Usage | None:
        if self._json:
            return self._json_usage(b"".join(self._tail))
        # Any of the line ends SSE allows (CR LF, LF, CR), and a data field with or
        # without its space: vLLM writes "data: ...\n\n", a server before it may not.
        for line in reversed(b"".join(self._tail).splitlines()):
            if b'"usage"' not in line or not line.startswith(b"data:"):
                continue
            data = line[5:].lstrip(b" ")
            if data.startswith(b"{") and b'"usage":{' in data.replace(b" ", b""):
                try:
                    return usage_from_object(orjson.loads(data))
                except orjson.JSONDecodeError:
                    return None
        return None

    @staticmethod
    def _json_usage(tail: bytes) -> Usage | None:
        """The last ``"usage": {...}`` object of a JSON body's tail (the whole body may
        not fit in it: only that object is parsed)."""
        at = tail.rfind(b'"usage"')
        if at < 0:
            return None
        rest = tail[at + len(b'"usage"'):].lstrip()
        if not rest.startswith(b":"):
            return None
        try:
            found, _ = json.JSONDecoder().raw_decode(rest[1:].lstrip().decode("utf-8", "replace"))
        except ValueError:
            return None
        return usage_from_object({"usage": found})

    def output_tokens(self, usage: Usage | None) -> int:
        """Completion tokens: from ``usage()`` when present, else content events seen."""
        if usage is not None and usage.completion_tokens:
            return usage.completion_tokens
        # vLLM sends a role chunk, one chunk per token, a finish chunk and [DONE].
        return max(0, self.events - 3)
