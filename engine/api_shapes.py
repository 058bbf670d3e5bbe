"""The chat requests vLLM turns its other generation APIs into, in one place.

vLLM 0.32 serves the Anthropic Messages API (``vllm/entrypoints/anthropic/serving.py``)
and the Responses API (``vllm/entrypoints/openai/responses/utils.py``) by converting
each request to chat messages and tools, which its chat template renders. Three parts
of this project need that conversion exactly: the gateway's routing, which hashes the
prompt vLLM will render (``gateway.request.prompt_shapes``), the simulator, which
answers these APIs as vLLM does (``engine.sim.anthropic_route``,
``engine.sim.responses_api``), and the prompt linter, which lints a Messages API body as
that chat request (``gateway.lint.shapes``). All use these functions, so they agree with
each other and are checked against vLLM once (the e2e stage compares the rendering with vLLM's own
``/v1/messages/render`` and ``/v1/responses/render``).

What vLLM hands the template as ``reasoning`` (Anthropic ``thinking`` blocks, Responses
``reasoning`` items) is kept under that key, which the chat rendering passes on
(``engine.tokenizer.conversation``).
"""

from __future__ import annotations

import json
import time
from typing import Any

import orjson


def read_json(raw: bytes) -> Any:
    """A request body as vLLM's server reads it (Python's ``json.loads``): orjson where
    it can, Python's reader where orjson refuses, which takes ``NaN``, ``Infinity``,
    numbers beyond a double (as infinite), lone surrogate escapes and UTF-16/32 bodies.
    Raises what Python's reader raises: ``ValueError`` (``UnicodeDecodeError`` for bytes
    that are no Unicode text), ``RecursionError`` past its nesting depth. A body orjson
    refuses as nested too deep (1,024 levels) is refused here: Python's reader would
    recurse to its own limit first, where a garbage collection then fails too."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):
            raise ValueError(f"nested too deep: {exc}") from None
        return json.loads(raw)


RESPONSES_TEXT_PARTS = frozenset({"text", "input_text", "output_text", "refusal"})
"""Parts of a Responses API message item carried over as text parts (their ``text``)."""

BILLING_HEADER = "x-anthropic-billing-header"
"""A text block Claude Code puts in ``system`` with a per-request hash in it; vLLM leaves
it out of the prompt."""

Message = dict[str, Any]


# -- Anthropic Messages API ---------------------------------------------------------------


def _billed(text: Any) -> bool:
    return isinstance(text, str) and text.startswith(BILLING_HEADER)


def _system_texts(value: Any, top: bool) -> list[str]:
    """A ``system`` field's (``top``) or a system-role message's text: a string, or its
    text blocks less the billing header (vLLM strips it from a system message's string
    too, not from the top-level string)."""
    if isinstance(value, str):
        return [value] if value and (top or not _billed(value)) else []
    if not isinstance(value, list):
        return []
    return [block["text"] for block in value
            if isinstance(block, dict) and block.get("type") == "text"
            and isinstance(block.get("text"), str) and block["text"]
            and not _billed(block["text"])]


def anthropic_system(body: dict[str, Any]) -> str:
    """The one system message vLLM makes: ``system`` and every system-role message's text
    joined, Claude Code's billing header left out ('' when there is none)."""
    texts = _system_texts(body.get("system"), True)
    for message in body.get("messages") or []:
        if isinstance(message, dict) and message.get("role") == "system":
            texts += _system_texts(message.get("content"), False)
    return "".join(texts)


def _image_url(source: Any) -> str | None:
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"
    url = source.get("url")
    return url if isinstance(url, str) else None


def _tool_result(block: dict[str, Any], into: list[Message]) -> None:
    """A user's ``tool_result`` as vLLM's tool message (its text items joined by new
    lines), then a user message with its images and a tool message with its tool
    references, when it has them."""
    content, call_id = block.get("content"), block.get("tool_use_id") or ""
    texts, images, references = [], [], []
    if isinstance(content, list):
        for item in content:
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "text":
                texts.append(str(item.get("text", "")))
            elif kind == "image" and (url := _image_url(item.get("source"))) is not None:
                images.append({"type": "image_url", "image_url": {"url": url}})
            elif kind == "tool_reference" and (item.get("tool_name") or item.get("name")):
                references.append({"type": "tool_reference",
                                   "name": item.get("tool_name") or item.get("name")})
        text = "\n".join(texts)
    else:
        text = content if isinstance(content, str) else ""
    into.append({"role": "tool", "tool_call_id": call_id, "content": text})
    if images:
        into.append({"role": "user", "content": images})
    if references:
        into.append({"role": "tool", "tool_call_id": call_id, "content": references})


def anthropic_message(message: dict[str, Any], into: list[Message]) -> None:
    """One non-system Anthropic message as the chat messages vLLM makes of it, appended
    to ``into``: text blocks as text (one alone as a string), images as ``image_url``
    parts, thinking as ``reasoning``, an assistant's tool uses as its tool calls (the
    input as JSON arguments), a user's tool results as tool messages before its text."""
    role, content = message["role"], message.get("content")
    if isinstance(content, str):
        into.append({"role": role, "content": content})
        return
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for block in content if isinstance(content, list) else []:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and block.get("text"):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image" and (url := _image_url(block.get("source"))) is not None:
            parts.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
        elif kind == "tool_use":
            calls.append({"id": block.get("id") or f"call_{int(time.time())}",
                          "type": "function", "function": {
                              "name": block.get("name") or "",
                              "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result" and role == "user":
            _tool_result(block, into)
        elif kind == "tool_result":
            text = str(block.get("content")) if block.get("content") else ""
            parts.append({"type": "text", "text": f"Tool result: {text}"})
    converted: Message = {"role": role}
    if reasoning:
        converted["reasoning"] = "".join(reasoning)
    if calls:
        converted["tool_calls"] = calls
    if parts:
        only_text = len(parts) == 1 and parts[0]["type"] == "text"
        converted["content"] = parts[0]["text"] if only_text else parts
    if "content" in converted or role != "user":
        into.append(converted)


def anthropic_messages(body: dict[str, Any]) -> list[Message]:
    """A Messages API body's system and messages as vLLM's chat messages (the body's
    messages are dicts with a role: validate before)."""
    system = anthropic_system(body)
    messages: list[Message] = [{"role": "system", "content": system}] if system else []
    for message in body.get("messages") or []:
        if message["role"] != "system":
            anthropic_message(message, messages)
    return messages


def anthropic_tools(tools: Any) -> list[dict[str, Any]]:
    """``tools`` as vLLM's chat tools (``input_schema`` the parameters; ``strict`` and
    ``defer_loading`` kept, dropped by the renderer when unset:
    ``engine.tokenizer.template_tools``)."""
    return [{"type": "function", "function": {
        "name": tool.get("name"), "description": tool.get("description"),
        "parameters": tool.get("input_schema"), "strict": tool.get("strict"),
        "defer_loading": tool.get("defer_loading")}}
        for tool in tools or [] if isinstance(tool, dict)]


CHAT_FIELDS = ("cache_salt", "chat_template_kwargs")
"""Members of a Messages or Responses API body that its chat request keeps as they are."""


def anthropic_chat(body: dict[str, Any]) -> dict[str, Any] | None:
    """A Messages API body as the chat request vLLM renders (thinking as the assistant's
    ``reasoning``, which the template renders as vLLM hands it), or None when its
    messages are not a non-empty list of objects with a role, or convert to none."""
    given = body.get("messages")
    if not isinstance(given, list) or not given or not all(
            isinstance(message, dict) and isinstance(message.get("role"), str)
            for message in given):
        return None
    messages = anthropic_messages(body)
    if not messages:
        return None
    chat: dict[str, Any] = {"messages": messages}
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        chat["tools"] = anthropic_tools(tools)
    for field in CHAT_FIELDS:
        if field in body:
            chat[field] = body[field]
    effort = _anthropic_effort(body)
    if effort is not None:
        chat["reasoning_effort"] = effort
    return chat


def _anthropic_effort(body: dict[str, Any]) -> Any:
    """The ``reasoning_effort`` vLLM 0.32 renders an Anthropic request with: its
    ``output_config.effort``, or ``"none"`` under ``thinking: {"type": "disabled"}`` (vLLM
    uses ``"low"`` instead for a template that renders ``"none"`` as it renders an
    effort, which the gateway does not probe for)."""
    output = body.get("output_config")
    effort = output.get("effort") if isinstance(output, dict) else None
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        effort = "none"
    return effort


# -- Responses API ------------------------------------------------------------------------


def _responses_message(item: dict[str, Any]) -> Message | None:
    """A message item as chat: text parts as text parts, other parts (images, files)
    kept as they are; None when it is not one."""
    role, content = item.get("role"), item.get("content")
    if not isinstance(role, str):
        return None
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        return None
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            return None
        if part["type"] not in RESPONSES_TEXT_PARTS:
            parts.append(part)
        elif isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        else:
            return None
    return {"role": role, "content": parts}


def responses_messages(body: dict[str, Any]) -> tuple[list[Message], bool]:
    """``instructions`` and ``input`` as vLLM's chat messages: message items, function
    calls as the tool calls of the assistant message before them (or of a new one),
    their outputs as tool messages, reasoning items as the assistant's ``reasoning``;
    an assistant message's text (its first part's) as the content of the assistant
    message before it when that one has none (a call's or a reasoning's), else as a new
    one; and whether every item had a chat form (False: the messages before the first
    that had none)."""
    messages: list[Message] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}], True
    if not isinstance(given, list):
        return messages, False
    for item in given:
        kind = item.get("type", "message") if isinstance(item, dict) else None
        last = messages[-1] if messages and messages[-1]["role"] == "assistant" else None
        if kind == "function_call" and isinstance(item.get("call_id"), str) \
                and not item.get("namespace"):
            call = {"id": item["call_id"], "type": "function", "function": {
                "name": item.get("name"), "arguments": item.get("arguments")}}
            if last is not None and isinstance(last.get("tool_calls"), list):
                last["tool_calls"].append(call)
            elif last is not None and "tool_calls" not in last:
                last["tool_calls"] = [call]
            else:
                messages.append({"role": "assistant", "tool_calls": [call]})
        elif kind == "function_call_output" and isinstance(item.get("call_id"), str):
            messages.append({"role": "tool", "content": item.get("output"),
                             "tool_call_id": item["call_id"]})
        elif kind == "reasoning":
            text = _reasoning_text(item)
            if last is not None and "reasoning" not in last:
                last["reasoning"] = text
            else:
                messages.append({"role": "assistant", "reasoning": text})
        elif kind == "message" and item.get("role") == "assistant":
            answer = _assistant_text(item.get("content"))
            if answer is None:
                return messages, False
            if last is not None and last.get("content") is None:
                last["content"] = answer  # the text of the call or reasoning before it
            else:
                messages.append({"role": "assistant", "content": answer})
        elif kind == "message" and (message := _responses_message(item)) is not None:
            messages.append(message)
        else:
            return messages, False
    return messages, True


def _assistant_text(content: Any) -> str | None:
    """An assistant message item's text as vLLM reads it: the string, or the text of its
    first part only (a second ``output_text`` part never reaches the prompt); None when
    that part has no text (a refusal): vLLM then hands the item to the template as it is."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and isinstance(content[0], dict) \
            and isinstance(content[0].get("text"), str):
        return content[0]["text"]
    return None


def _reasoning_text(item: dict[str, Any]) -> str:
    for field in ("content", "summary"):
        parts = item.get(field)
        if isinstance(parts, list) and parts and isinstance(parts[0], dict):
            return str(parts[0].get("text", ""))
    return ""


def responses_tools(tools: Any) -> list[dict[str, Any]]:
    """A Responses body's function tools as the chat tools vLLM renders them with (flat
    ``{type, name, ...}`` to ``{type, function: {name, ...}}``; the renderer keeps the
    fields vLLM keeps: ``engine.tokenizer.template_tools``). Built-in tools
    (``web_search``...) are not rendered by vLLM either."""
    if not isinstance(tools, list):
        return []
    return [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
            for tool in tools if isinstance(tool, dict) and tool.get("type") == "function"]
