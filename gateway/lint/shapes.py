"""An Anthropic Messages API body linted as the chat request vLLM renders it.

vLLM serves ``/v1/messages`` by turning the body into a chat request
(``engine.api_shapes.anthropic_chat``, the conversion routing uses too): the
top-level ``system`` (a string or text blocks) and any system-role message
become one system message in front, text blocks become text, images
``image_url`` parts, an assistant's ``tool_use`` blocks its tool calls, a
user's ``tool_result`` blocks tool messages, ``tools`` functions
(``input_schema`` the parameters). The linter lints that chat request, so the
system prompt, where dynamic dates usually are, is linted as the system prompt.

``chat_form(body)`` gives the chat request and where its texts come from in the
body; ``in_body`` then puts every finding back on the body's own paths and
offsets (``system``, ``system[1].text`` at the offset inside that block,
``messages[2].content[0].text``, ``tools[0].input_schema...``), so a report
and the CLI's ``FILE:LINE:COLUMN`` point into what the user wrote. A path the
body has no text for (a tool call's JSON arguments, made from ``input``) is
placed at the value it was made from.

A body is read this way when it has a top-level ``system`` or a block only
the Messages API has (``MESSAGES_API_BLOCKS``); a chat request has neither.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from engine.api_shapes import BILLING_HEADER, anthropic_chat, anthropic_message, anthropic_system
from gateway.lint.model import BatchReport, Finding, LintReport, VaryingSpan
from gateway.lint.structure import text_fields

MESSAGES_API_BLOCKS = frozenset({"tool_use", "tool_result", "image", "document",
                                 "redacted_thinking"})
"""Content block types of the Messages API that chat requests do not have."""

_MESSAGE = re.compile(r"messages\[([0-9]+)\]")
_TOOL = re.compile(r"tools\[([0-9]+)\](?:\.function(?:\.(parameters|description|name))?)?")
_CALL = re.compile(r"messages\[([0-9]+)\]\.tool_calls\[([0-9]+)\]")


def is_messages_api(body: Mapping[str, Any]) -> bool:
    """Whether a body with ``messages`` is a Messages API body, not a chat request."""
    if "system" in body:
        return True
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list) and any(
                isinstance(block, Mapping) and block.get("type") in MESSAGES_API_BLOCKS
                for block in content):
            return True
    return False


@dataclass(frozen=True, slots=True)
class Piece:
    at: int
    """Where the piece starts in the chat request's text."""
    path: str
    """The body's own path of the text it is."""


@dataclass(frozen=True, slots=True)
class ChatForm:
    chat: dict[str, Any]
    """The chat request the linter lints."""
    pieces: dict[str, tuple[Piece, ...]]
    """A chat text's path -> the body's texts it is made of, in order."""
    messages: dict[int, int]
    """A chat message's index -> the index of the body's message it was made from."""
    calls: dict[tuple[int, int], str]
    """(chat message, tool call) -> the path of the ``tool_use`` block's ``input``."""
    tools: dict[int, int]
    """A chat tool's index -> the body's."""
    images: dict[str, str] = field(default_factory=dict)
    """A chat image part's path -> the path of the ``image`` block it was made from."""

    def origin(self, path: str, start: int, end: int) -> tuple[str, int, int]:
        """A chat request's path and offsets as the body's."""
        if path in self.images:
            return self.images[path], start, end
        pieces = self.pieces.get(path)
        if pieces:
            index = max(0, next((i for i, p in enumerate(pieces) if p.at > start),
                                len(pieces)) - 1)
            piece = pieces[index]
            stop = pieces[index + 1].at if index + 1 < len(pieces) else end
            return piece.path, start - piece.at, max(start, min(end, stop)) - piece.at
        call = _CALL.match(path)
        if call and (int(call[1]), int(call[2])) in self.calls:
            return self.calls[int(call[1]), int(call[2])], start, end
        tool = _TOOL.match(path)
        if tool and int(tool[1]) in self.tools:
            body_path = f"tools[{self.tools[int(tool[1])]}]"
            field = {"parameters": "input_schema"}.get(tool[2] or "", tool[2])
            rest = path[tool.end():] if tool[2] else ""
            return body_path + (f".{field}" if field else "") + rest, start, end
        message = _MESSAGE.match(path)
        if message:
            found = self.messages.get(int(message[1]))
            return (f"messages[{found}]" if found is not None else "messages"), 0, 0
        return path, start, end


def chat_form(body: dict[str, Any]) -> ChatForm | None:
    """The chat request a Messages API body is rendered as, with where its texts come
    from; None when it has none (``anthropic_chat``)."""
    chat = anthropic_chat(body)
    if chat is None:
        return None
    given: list[dict[str, Any]] = body["messages"]
    converted: list[dict[str, Any]] = chat["messages"]
    fields: dict[int, list[tuple[str, str]]] = {}
    for text_field in text_fields(chat):
        if text_field.message is not None:
            fields.setdefault(text_field.message, []).append((text_field.path, text_field.text))
    pieces: dict[str, tuple[Piece, ...]] = {}
    messages: dict[int, int] = {}
    first = 0
    if anthropic_system(body):  # the system message vLLM puts in front
        first = 1
        for path, text in fields.get(0, []):
            pieces[path] = tuple(_pieces(text, _system_texts(body), set()))
    calls: dict[tuple[int, int], str] = {}
    images: dict[str, str] = {}
    for index, message in enumerate(given):
        if message["role"] == "system":
            continue
        made: list[dict[str, Any]] = []
        anthropic_message(message, made)  # how many chat messages vLLM makes of it
        texts, used = _texts(message, f"messages[{index}]"), set[int]()
        uses = _tool_uses(message, f"messages[{index}]")
        sources = _images(message, f"messages[{index}]")
        for chat_index in range(first, first + len(made)):
            messages[chat_index] = index
            images.update(_image_paths(converted[chat_index], chat_index, sources))
            for path, text in fields.get(chat_index, []):
                found = tuple(_pieces(text, texts, used))
                if found:
                    pieces[path] = found
            for call in range(len(converted[chat_index].get("tool_calls") or ())):
                if call < len(uses):
                    calls[chat_index, call] = uses[call]
        first += len(made)
    tools = body.get("tools")
    numbers = [i for i, tool in enumerate(tools) if isinstance(tool, dict)] \
        if isinstance(tools, list) else []
    return ChatForm(chat, pieces, messages, calls, dict(enumerate(numbers)), images)


def _system_texts(body: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The texts the system message is joined from, in order: ``system`` (a string, or
    its text blocks), then the system-role messages' texts; Claude Code's billing header
    left out, as vLLM leaves it out (but from a top-level string)."""
    out: list[tuple[str, str]] = []
    system = body.get("system")
    if isinstance(system, str):
        out.append(("system", system))
    elif isinstance(system, list):
        out += [(f"system[{k}].text", block["text"]) for k, block in enumerate(system)
                if isinstance(block, Mapping) and block.get("type") == "text"
                and isinstance(block.get("text"), str)]
    for index, message in enumerate(body.get("messages") or []):
        if isinstance(message, Mapping) and message.get("role") == "system":
            out += _texts(message, f"messages[{index}]")
    return [(path, text) for path, text in out
            if path == "system" or not text.startswith(BILLING_HEADER)]


def _texts(message: Mapping[str, Any], path: str) -> list[tuple[str, str]]:
    """A message's texts with their paths: its string content, its text blocks, its tool
    results' strings and text items."""
    content = message.get("content")
    if isinstance(content, str):
        return [(f"{path}.content", content)]
    out: list[tuple[str, str]] = []
    for k, block in enumerate(content if isinstance(content, list) else ()):
        if not isinstance(block, Mapping):
            continue
        if isinstance(block.get("text"), str):
            out.append((f"{path}.content[{k}].text", block["text"]))
        inner = block.get("content") if block.get("type") == "tool_result" else None
        if isinstance(inner, str):
            out.append((f"{path}.content[{k}].content", inner))
        elif isinstance(inner, list):
            out += [(f"{path}.content[{k}].content[{m}].text", item["text"])
                    for m, item in enumerate(inner)
                    if isinstance(item, Mapping) and isinstance(item.get("text"), str)]
    return out


def _tool_uses(message: Mapping[str, Any], path: str) -> list[str]:
    content = message.get("content")
    return [f"{path}.content[{k}].input" for k, block in enumerate(
        content if isinstance(content, list) else ())
        if isinstance(block, Mapping) and block.get("type") == "tool_use"]


def _images(message: Mapping[str, Any], path: str) -> list[tuple[str, Any]]:
    """A message's image blocks (in tool results too), with their paths and sources."""
    content = message.get("content")
    out: list[tuple[str, Any]] = []
    for k, block in enumerate(content if isinstance(content, list) else ()):
        if not isinstance(block, Mapping):
            continue
        if block.get("type") == "image":
            out.append((f"{path}.content[{k}]", block.get("source")))
        inner = block.get("content") if block.get("type") == "tool_result" else None
        out += [(f"{path}.content[{k}].content[{m}]", item.get("source"))
                for m, item in enumerate(inner if isinstance(inner, list) else ())
                if isinstance(item, Mapping) and item.get("type") == "image"]
    return out


def _image_paths(message: Mapping[str, Any], index: int,
                 sources: list[tuple[str, Any]]) -> Iterator[tuple[str, str]]:
    """Each image part of a chat message with the path of the block whose source it is
    (a URL, or base64 data as a data URL); the blocks found are taken out of ``sources``."""
    content = message.get("content")
    for p, part in enumerate(content if isinstance(content, list) else ()):
        url = part.get("image_url", {}).get("url") if part.get("type") == "image_url" else None
        for found, (path, source) in enumerate(sources):
            if isinstance(url, str) and isinstance(source, Mapping) and (
                    source.get("url") == url or (isinstance(source.get("data"), str)
                                                 and url.endswith(";base64," + source["data"]))):
                yield f"messages[{index}].content[{p}]", path
                del sources[found]
                break


def _pieces(text: str, texts: Sequence[tuple[str, str]], used: set[int]) -> list[Piece]:
    """The body's texts ``text`` is made of: the first unused one it starts with, then
    those after it that follow on (after a new line, as tool results' items are joined);
    none when it starts with none of them."""
    out: list[Piece] = []
    at, index = 0, 0
    while at < len(text) and index < len(texts):
        path, piece = texts[index]
        if out and text.startswith("\n", at) and not text.startswith(piece, at):
            at += 1
        if index not in used and piece and text.startswith(piece, at):
            out.append(Piece(at, path))
            used.add(index)
            at += len(piece)
        elif out and piece:
            break  # no longer following on
        index += 1
    return out


# -- findings back on the body's paths -------------------------------------------------------


def in_body(report: LintReport, form: ChatForm | None) -> LintReport:
    """The report with every finding on the body's paths (the report itself for a chat
    request: ``form`` None)."""
    if form is None:
        return report
    return replace(report, findings=tuple(_moved(f, form) for f in report.findings))


def batch_in_body(report: BatchReport, forms: Sequence[ChatForm | None]) -> BatchReport:
    """The same for a batch: each request's findings, and each group's, on the paths of
    the body they are in (``Finding.request``, else the group's first request)."""
    if not any(forms):
        return report
    groups = []
    for group in report.groups:
        form = forms[group.requests[0]]
        groups.append(replace(
            group,
            findings=tuple(_moved(f, forms[group.requests[0] if f.request is None
                                           else f.request]) for f in group.findings),
            varying=tuple(_moved(v, form) for v in group.varying)))
    return BatchReport(tuple(in_body(r, f) for r, f in zip(report.reports, forms, strict=True)),
                       tuple(groups))


_Placed = TypeVar("_Placed", Finding, VaryingSpan)


def _moved(item: _Placed, form: ChatForm | None) -> _Placed:
    """A finding or a varying span on the body's path and offsets."""
    if form is None:
        return item
    path, start, end = form.origin(item.path, item.start, item.end)
    return replace(item, path=path, start=start, end=end)
