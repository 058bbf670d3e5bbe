"""Where each text field of a request lands in its rendered prompt.

Message contents are placed by rendering the request once more with every
content replaced by a short unique marker: the markers' positions, shifted by
the lengths of the real contents before them, give each content's offset in
the real rendering. A template that rewrites content (strips it, splits off
reasoning) fails the check that the real text is really there; that content
is then searched for after the previous one. Strings inside tools and
tool-call arguments are rendered as JSON by the template, so they are found
by searching their JSON-escaped text after the tool's name.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from engine.tokenizer import Renderer, RenderError
from gateway.lint.structure import TextField, message_text


class Layout:
    def __init__(self, rendered: str, body: Mapping[str, Any], renderer: Renderer | None) -> None:
        self.rendered = rendered
        messages = body.get("messages") or []
        self.contents = [message_text(m) for m in messages]
        self.message_at: dict[int, int] = self._by_markers(body, renderer)
        cursor = 0
        for index, content in enumerate(self.contents):
            at = self.message_at.get(index)
            if at is not None and rendered.startswith(content, at):
                cursor = at + len(content)
                continue
            found = rendered.find(content, cursor) if content else -1
            if found >= 0:
                self.message_at[index] = found
                cursor = found + len(content)
            else:
                self.message_at.pop(index, None)
        self.tool_at = self._tools(body.get("tools"))

    def _by_markers(self, body: Mapping[str, Any], renderer: Renderer | None) -> dict[int, int]:
        messages = body.get("messages")
        if renderer is None or not isinstance(messages, list):
            return {}
        markers = [f"\ue000{index}\ue001" for index in range(len(messages))]
        marked = [{**m, "content": markers[i]} if isinstance(m, Mapping) else m
                  for i, m in enumerate(messages)]
        try:
            text = renderer.render_chat({**body, "messages": marked})
        except (RenderError, TypeError, ValueError):
            return {}
        # Where each message's marker landed, in the order they appear: vLLM may render a
        # message elsewhere than its place in the list (a developer message merged into
        # the system prompt in front: engine.tokenizer.developer_as_system).
        landed = sorted((found, index) for index, marker in enumerate(markers)
                        if (found := text.find(marker)) >= 0)
        out: dict[int, int] = {}
        shift = 0
        for found, index in landed:
            out[index] = found + shift
            shift += len(self.contents[index]) - len(markers[index])
        return out

    def _tools(self, tools: Any) -> dict[int, int]:
        out: dict[int, int] = {}
        if not isinstance(tools, list):
            return out
        cursor = 0
        for index, tool in enumerate(tools):
            function = tool.get("function") if isinstance(tool, Mapping) else None
            name = function.get("name") if isinstance(function, Mapping) else None
            if not isinstance(name, str):
                continue
            found = self.rendered.find(json.dumps(name, ensure_ascii=False), cursor)
            if found >= 0:
                out[index] = found
                cursor = found
        return out

    def place(self, field: TextField, start: int) -> int | None:
        """Offset in the rendered prompt of character ``start`` of ``field``."""
        if field.message is not None and field.path.endswith("].content"):
            at = self.message_at.get(field.message)
            return None if at is None else at + start
        if field.message is not None and ".content[" in field.path:
            at = self.message_at.get(field.message)
            if at is None:
                return None
            found = self.rendered.find(field.text, at)
            return None if found < 0 else found + start
        # A string the template renders as JSON: search its escaped text.
        anchor = (self.tool_at.get(field.tool, 0) if field.tool is not None
                  else self.message_at.get(field.message or 0, 0))
        escaped = json.dumps(field.text, ensure_ascii=False)[1:-1]
        found = self.rendered.find(escaped, anchor)
        if found < 0:
            found = self.rendered.find(escaped)
        if found < 0:
            return None
        return found + len(json.dumps(field.text[:start], ensure_ascii=False)) - 2

    def final_offset(self, first_final: int, messages: Sequence[Any]) -> int:
        """Where the final turn's content starts (the end of the prompt when there is none)."""
        if first_final >= len(messages):
            return len(self.rendered)
        at = self.message_at.get(first_final)
        return at if at is not None else len(self.rendered)
