"""What routing reads of a request, bounded; and what the memos' entries weigh.

Routing is an optimisation: it never needs the whole of a huge prompt. A
chat request is reduced to its first ``max_routed_messages`` messages and
``max_routed_chars`` characters of content (the last message kept is cut
to fit) before it is rendered; a completions prompt to its first
``max_routed_chars`` characters or ``max_routed_tokens`` token ids. The
hasher then hashes at most ``max_routed_tokens`` tokens. The request itself
is forwarded whole: the replica sees every byte the client sent.

What routing will not analyse at all (the request is routed by load, and
counted in ``prefixgate_routing_unanalysed_total{reason}``):

* ``media``: an image, audio, video or file part in a message. The replica
  expands it into tokens the gateway cannot know (their number depends on
  the image), so routing reads the messages before the first message that
  holds one (a shared system prompt, earlier text turns) and routes on
  their blocks; the request is counted, and routed by load only when the
  first message already holds one.
* ``client_template``: a request's own ``chat_template``. It is code the
  client wrote; rendering it is unbounded work (two nested loops of 8000 are
  64M iterations) and unbounded memory (``'x' * 10**9``) that a worker thread
  cannot be stopped from doing. Such a request is rendered for routing with
  the model's own template instead (its ``chat_template_kwargs`` are data and
  are kept): requests sharing leading messages still share leading blocks,
  so they still follow each other; only the block hashes are the gateway's
  guess, not the replica's (vLLM refuses request templates by default
  anyway: ``--trust-request-chat-template``).
* ``oversize``: ``tools`` or ``chat_template_kwargs`` larger than
  ``max_routed_chars`` serialized, or nested deeper than JSON serialization
  allows.
* ``token_ids``: a completions prompt of token ids with one outside
  ``[0, 2**32)`` or not an integer (the replica answers such a request).
* ``render``: the prompt cannot be rendered (the replica answers it).

Sizes: the memos weigh each entry in estimated bytes (``sys.getsizeof`` of
its text, ~36 bytes per token id and 40 per block hash held, plus a fixed
overhead per entry) so a byte bound holds whatever the shape of traffic.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from engine.tokenizer import TEXT_PARTS, Renderer, RenderError

ENTRY_BYTES = 160
"""An ordered-dict slot and its (value, weight, size) tuple."""
TOKEN_BYTES = 36
"""A token id in a tuple: the pointer and (above 256) its int object."""
HASH_BYTES = 40
"""A 64-bit block hash in a tuple: the pointer and its int object."""

MAX_TOKEN_ID = 1 << 32

RENDER_FAILURES = (RenderError, RecursionError, TypeError, ValueError)
"""What rendering a hostile request may raise (a template's ``tojson`` of nested
tools recurses; a template may call a filter with the wrong type): all of
them mean "route by load"."""


def text_bytes(text: str | bytes) -> int:
    return sys.getsizeof(text)


def ids_bytes(count: int) -> int:
    return 56 + TOKEN_BYTES * count


def hashes_bytes(count: int) -> int:
    return 56 + HASH_BYTES * count


@dataclass(frozen=True, slots=True)
class Routable:
    """The part of a chat request routing analyses."""

    body: Mapping[str, Any]
    cut: bool
    """Whether messages or content were left out."""
    client_template: bool
    media: bool = False
    """Whether messages were left out from the first one holding an image, audio,
    video or file part."""


class Unanalysed(Exception):
    """Routing will not analyse this request; route it by load. ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def routable_chat(body: Mapping[str, Any], max_chars: int, max_messages: int) -> Routable:
    """``body`` reduced to what routing analyses (see the module docstring)."""
    for name in ("tools", "chat_template_kwargs"):
        if body.get(name) is not None and _json_size(body[name]) > max_chars:
            raise Unanalysed("oversize")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise Unanalysed("render")
    kept: list[Any] = []
    budget = max_chars
    media = _first_with_media(messages, max_messages)
    if media == 0:
        raise Unanalysed("media")
    limit = max_messages if media is None else media
    cut = len(messages) > limit
    for message in messages[:limit]:
        if budget <= 0:
            cut = True
            break
        clipped, used = _clip_message(message, budget)
        cut = cut or clipped is not message
        kept.append(clipped)
        budget -= used
    client_template = body.get("chat_template") is not None
    if not cut and not client_template:
        return Routable(body, False, False)
    reduced = {k: v for k, v in body.items() if k != "chat_template"}
    reduced["messages"] = kept
    return Routable(reduced, cut, client_template, media is not None)


def _first_with_media(messages: list[Any], max_messages: int) -> int | None:
    """The index of the first message (of those routing reads) with a part that is not
    text, or None."""
    for index, message in enumerate(messages[:max_messages]):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and any(
                isinstance(part, Mapping) and isinstance(part.get("type"), str)
                and part["type"] not in TEXT_PARTS for part in content):
            return index
    return None


def _clip_message(message: Any, budget: int) -> tuple[Any, int]:
    """The message with its content cut to ``budget`` characters, and what it used."""
    if not isinstance(message, Mapping):
        return message, 1
    extra = 0
    if len(message) > 2 or (len(message) == 2 and "content" not in message):
        others = {k: v for k, v in message.items() if k != "content"}
        extra = _json_size(others)
        if extra > budget:
            raise Unanalysed("oversize")
    content = message.get("content")
    if isinstance(content, str):
        if len(content) + extra <= budget:
            return message, len(content) + extra
        return {**message, "content": content[:max(budget - extra, 0)]}, budget
    if isinstance(content, list):
        parts, used = _clip_parts(content, budget - extra)
        if parts is content:
            return message, used + extra
        return {**message, "content": parts}, budget
    return message, extra + 1


def _clip_parts(parts: list[Any], budget: int) -> tuple[list[Any], int]:
    kept: list[Any] = []
    used = 0
    for part in parts:
        text = part.get("text") if isinstance(part, Mapping) else part
        size = len(text) if isinstance(text, str) else 1
        if used + size > budget:
            if isinstance(text, str) and budget - used > 0:
                kept.append({**part, "text": text[:budget - used]} if isinstance(part, Mapping)
                            else text[:budget - used])
            return kept, budget
        kept.append(part)
        used += size
    return parts, used


def _json_size(value: Any) -> int:
    try:
        return len(orjson.dumps(value))
    except (TypeError, ValueError):  # too deep (orjson stops at 255 levels), not JSON
        raise Unanalysed("oversize") from None


def routable_ids(prompt: Sequence[Any], max_tokens: int) -> tuple[int, ...]:
    """The leading token ids routing hashes; ``Unanalysed`` when one is not a token id."""
    head = prompt[:max_tokens]
    for token in head:
        if type(token) is not int or not 0 <= token < MAX_TOKEN_ID:
            raise Unanalysed("token_ids")
    return tuple(head)


class ModelTemplate:
    """A renderer that renders every chat request with the model's own template.

    A request's ``chat_template`` is dropped before rendering (see the module
    docstring); everything else is the wrapped renderer's. The hasher, the
    conversation memo and the linter all render through it.
    """

    def __init__(self, inner: Renderer) -> None:
        self.inner = inner
        self.name = inner.name
        self.units_per_token = inner.units_per_token

    def __getattr__(self, name: str) -> Any:  # added_tokens, has_chat_template, path ...
        return getattr(self.inner, name)

    def render_chat(self, request: Mapping[str, Any]) -> str:
        return self.inner.render_chat(without_template(request))

    def chat_token_ids(self, request: Mapping[str, Any]) -> list[int]:
        return self.inner.chat_token_ids(without_template(request))

    def as_vllm_reads(self, request: Mapping[str, Any]) -> Mapping[str, Any]:
        read = self.inner.as_vllm_reads(without_template(request))
        messages = read.get("messages")
        return request if messages is request.get("messages") else {**request, "messages": messages}

    def text_token_ids(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.inner.text_token_ids(text, add_special_tokens)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.inner.decode(token_ids)

    def encode_with_offsets(self, text: str) -> tuple[list[int], Any] | None:
        return self.inner.encode_with_offsets(text)


def without_template(request: Mapping[str, Any]) -> Mapping[str, Any]:
    if request.get("chat_template") is None:
        return request
    return {k: v for k, v in request.items() if k != "chat_template"}
