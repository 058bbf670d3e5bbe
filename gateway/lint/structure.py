"""A chat request as the linter sees it: its text fields, where each sits, and its shape.

``text_fields(body)`` walks every text the prompt is built from, with its JSON
path and region:

* ``system``  leading system/developer messages;
* ``tools``   every string inside ``tools`` (descriptions, enum values ...);
* ``history`` earlier turns (and their tool-call arguments);
* ``final``   the trailing turn(s) after the last assistant message: new text
  on every request anyway, so a finding there costs no cache.

``media_parts`` are the parts that are not text (images, audio, video, files):
the linter leaves them out of what it renders (``without_media``) and notes
each one.

The shape checks need no patterns: Unicode that changes tokens without
changing what a reader sees (``unicode_findings``), tools whose JSON is
assembled in a different key order from one tool to the next
(``tool_findings``), and a ``cache_salt`` that looks unique per request.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from engine.tokenizer import TEXT_PARTS, RenderError, fold_content, template_tools
from gateway.lint.model import Finding
from gateway.lint.suggest import suggestion

Region = Literal["system", "tools", "history", "final"]
MAX_DEPTH = 64
"""Deepest nesting of a tool the linter walks; deeper values are not looked into (and
``/v1/prompt/lint`` refuses such a body)."""
ZERO_WIDTH = ("\u200b", "\u200c", "\u200d", "\u2060", "\u180e")
NO_BREAK_SPACES = ("\u00a0", "\u202f", "\u2007")


@dataclass(frozen=True, slots=True)
class TextField:
    path: str
    text: str
    region: Region
    message: int | None = None
    """Index of the message the text belongs to (None for tools)."""
    tool: int | None = None


def final_start(messages: Sequence[Any]) -> int:
    """Index of the first message of the final turn (len(messages) when there is none)."""
    leading = 0
    while leading < len(messages) and _role(messages[leading]) in ("system", "developer"):
        leading += 1
    last_assistant = max((i for i, m in enumerate(messages) if _role(m) == "assistant"),
                         default=-1)
    return max(leading, last_assistant + 1)


def leading_system(messages: Sequence[Any]) -> int:
    count = 0
    while count < len(messages) and _role(messages[count]) in ("system", "developer"):
        count += 1
    return count


def _role(message: Any) -> str:
    return message.get("role", "") if isinstance(message, Mapping) else ""


def text_fields(body: Mapping[str, Any]) -> list[TextField]:
    messages = body.get("messages") or []
    tools = body.get("tools") or []
    out: list[TextField] = []
    if isinstance(tools, list):
        for index, tool in enumerate(tools):
            out.extend(TextField(path, text, "tools", tool=index)
                       for path, text in _strings(tool, f"tools[{index}]"))
    if not isinstance(messages, list):
        return out
    first_final = final_start(messages)
    system = leading_system(messages)
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping):
            continue
        region: Region = ("system" if index < system else
                          "final" if index >= first_final else "history")
        content = message.get("content")
        if isinstance(content, str):
            out.append(TextField(f"messages[{index}].content", content, region, index))
        elif isinstance(content, list):
            for part_index, part in enumerate(content):
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    out.append(TextField(f"messages[{index}].content[{part_index}].text",
                                         part["text"], region, index))
        calls = message.get("tool_calls")
        for call_index, call in enumerate(calls if isinstance(calls, list) else ()):
            function = call.get("function") if isinstance(call, Mapping) else None
            if isinstance(function, Mapping) and isinstance(function.get("arguments"), str):
                out.append(TextField(
                    f"messages[{index}].tool_calls[{call_index}].function.arguments",
                    function["arguments"], region, index))
    return out


def media_parts(body: Mapping[str, Any]) -> list[tuple[int, int, str]]:
    """``(message, part, type)`` of every part that is not text (``image_url``,
    ``input_audio``, ``video_url``, ``file`` ...): vLLM turns it into tokens of its own,
    which the linter neither reads nor renders."""
    messages = body.get("messages")
    out: list[tuple[int, int, str]] = []
    for index, message in enumerate(messages if isinstance(messages, list) else ()):
        content = message.get("content") if isinstance(message, Mapping) else None
        for part_index, part in enumerate(content if isinstance(content, list) else ()):
            kind = part.get("type") if isinstance(part, Mapping) else None
            if isinstance(kind, str) and kind not in TEXT_PARTS:
                out.append((index, part_index, kind))
    return out


def without_media(body: Mapping[str, Any], media: Sequence[tuple[int, int, str]]
                  ) -> Mapping[str, Any]:
    """The request with its ``media`` parts left out: what the linter renders (the same
    messages, so message indices hold); the body itself when it has none."""
    if not media:
        return body
    dropped = {(index, part) for index, part, _ in media}
    messages = [
        {**message, "content": [p for k, p in enumerate(message["content"])
                                if (index, k) not in dropped]}
        if any(i == index for i, _ in dropped) else message
        for index, message in enumerate(body["messages"])]
    return {**body, "messages": messages}


def prefix_fields(body: Mapping[str, Any]) -> list[TextField]:
    """The fields before the final turn: what the cache can keep, and what is linted."""
    return [f for f in text_fields(body) if f.region != "final"]


LINT_VIEW_MEMBERS = ("tools", "cache_salt", "chat_template_kwargs")


def lint_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """What the live lint reads of a request besides its prefix fields (``prefix_fields``):
    the members in ``LINT_VIEW_MEMBERS`` and the roles of the leading system messages
    (``leading_system``). ``LintService.examine`` finds the same on it as on the whole body;
    it is what the linter's own process is sent (``gateway.server.lint_process``)."""
    messages = body.get("messages")
    roles = messages[:leading_system(messages)] if isinstance(messages, list) else []
    view: dict[str, Any] = {"messages": [{"role": m["role"]} for m in roles]}
    for name in LINT_VIEW_MEMBERS:
        if name in body:
            view[name] = body[name]
    return view


def message_text(message: Any) -> str:
    """The content as the template sees it (parts folded), or "" when it cannot be folded."""
    if not isinstance(message, Mapping):
        return ""
    try:
        return fold_content(message.get("content"))
    except RenderError:
        return ""


def deeper_than(value: Any, depth: int) -> bool:
    """Whether ``value`` nests containers more than ``depth`` levels (iterative: any depth)."""
    stack = [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, Mapping):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if level >= depth:
            return True
        stack.extend((child, level + 1) for child in children
                     if isinstance(child, (Mapping, list)))
    return False


def _strings(value: Any, path: str, depth: int = 0) -> Iterator[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif depth >= MAX_DEPTH:
        return
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(item, f"{path}.{key}", depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, f"{path}[{index}]", depth + 1)


# -- Unicode ----------------------------------------------------------------------------


def unicode_findings(field: TextField) -> list[Finding]:
    """Invisible differences: same text to a reader, different tokens to the model.

    Reported as ``info``: they break the cache only when another request of
    the app carries the other form, which the cross-request comparison shows.
    One finding per problem and field, at its first occurrence.
    """
    text = field.text
    if text.isascii() and "\r" not in text and " \n" not in text and "\t\n" not in text:
        return []
    found: list[tuple[int, int, str, str]] = []
    if text.startswith("\ufeff"):
        found.append((0, 1, "bom", "a byte-order mark starts the text"))
    for char in ZERO_WIDTH + ("\ufeff",):
        index = text.find(char, 1 if char == "\ufeff" else 0)
        if index >= 0:
            found.append((index, index + 1, "zero_width",
                          f"zero-width character U+{ord(char):04X} ({text.count(char)}x)"))
    for char in NO_BREAK_SPACES:
        index = text.find(char)
        if index >= 0:
            found.append((index, index + 1, "nbsp",
                          f"no-break space U+{ord(char):04X} ({text.count(char)}x)"))
    crlf = text.count("\r\n")
    if crlf:
        lf = text.count("\n") - crlf
        index = text.find("\r\n")
        what = f"CRLF line endings ({crlf}x" + (f", mixed with {lf} LF)" if lf else ")")
        found.append((index, index + 2, "crlf", what))
    trailing = _trailing_space(text)
    if trailing is not None:
        found.append((trailing[0], trailing[1], "trailing_space", "trailing spaces before a newline"))
    if not text.isascii() and not unicodedata.is_normalized("NFC", text):
        span = _first_not_nfc(text)
        found.append((span[0], span[1], "not_nfc", "text is not in NFC (decomposed accents)"))
    return [Finding("unicode", text[start:end], field.path, start, end, "info", 0.6,
                    suggestion("unicode", field.region, problem), detail=what)
            for start, end, problem, what in found]


def _trailing_space(text: str) -> tuple[int, int] | None:
    best = None
    for marker in (" \n", "\t\n", " \r\n"):
        index = text.find(marker)
        if index >= 0 and (best is None or index < best):
            best = index
    if best is None:
        return None
    start = best
    while start > 0 and text[start - 1] in " \t":
        start -= 1
    return start, best + 1


def _first_not_nfc(text: str) -> tuple[int, int]:
    for index, char in enumerate(text):
        if unicodedata.combining(char):
            start = max(0, index - 1)
            end = index + 1
            while end < len(text) and unicodedata.combining(text[end]):
                end += 1
            if unicodedata.normalize("NFC", text[start:end]) != text[start:end]:
                return start, end
    return 0, min(len(text), 1)


# -- tools and salt ---------------------------------------------------------------------


def tool_findings(tools: Any) -> list[Finding]:
    """Tools built with different key orders: the serializer's order is not fixed. Only
    orders the rendered prompt keeps count: vLLM rebuilds each function tool as ``{type,
    function: {name, description, parameters}}`` in that order (``template_tools``), so
    the order of those keys never reaches the template; the order inside ``parameters``
    does."""
    if not isinstance(tools, list) or len(tools) < 2:
        return []
    out: list[Finding] = []
    reference: dict[str, tuple[str, ...]] = {}
    for index, tool in enumerate(template_tools(tools)):
        for path, keys in _key_orders(tool, ""):
            seen = reference.setdefault(path, keys)
            if set(seen) == set(keys) and seen != keys:
                out.append(Finding(
                    "unstable_json", ", ".join(keys), f"tools[{index}]{path}", 0, 0, "info", 0.6,
                    suggestion("unstable_json", "tools"),
                    detail=f"keys in order ({', '.join(keys)}); an earlier tool has "
                           f"({', '.join(seen)})"))
                break
    names = [_tool_name(t) for t in tools]
    duplicates = sorted({n for n in names if n and names.count(n) > 1})
    for name in duplicates:
        index = names.index(name)
        out.append(Finding("unstable_json", name, f"tools[{index}].function.name", 0, len(name),
                           "info", 0.5, suggestion("unstable_json", "tools"),
                           detail=f"tool {name!r} is listed more than once"))
    return out


def _key_orders(value: Any, path: str, depth: int = 0) -> Iterator[tuple[str, tuple[str, ...]]]:
    if isinstance(value, Mapping) and depth < MAX_DEPTH:
        if len(value) > 1:
            yield path, tuple(str(k) for k in value)
        for key, item in value.items():
            if key in ("properties",):
                continue  # property names are the tool's own, not a serializer's order
            yield from _key_orders(item, f"{path}.{key}", depth + 1)


def _tool_name(tool: Any) -> str:
    if not isinstance(tool, Mapping):
        return ""
    function = tool.get("function")
    if isinstance(function, Mapping) and isinstance(function.get("name"), str):
        return str(function["name"])
    return str(tool.get("name") or "")


def tool_names(tools: Any) -> tuple[str, ...]:
    return tuple(_tool_name(t) for t in tools) if isinstance(tools, list) else ()
