"""What prompt a request body carries, as routing renders it.

Chat bodies (``/v1/chat/completions``, ``/v1/chat/completions/render``) and
completion bodies render as they are; a batch of chats
(``/v1/chat/completions/batch``) as its first conversation, a token-in-token-out
``/inference/v1/generate`` body as a completion of its ``token_ids``, SageMaker's
``/invocations`` as the chat or completion its shape makes it. A ``/v1/responses`` body is rendered
like the chat request vLLM turns it into: ``instructions`` as the system
message, function ``tools`` as chat tools, then ``input`` (a string is one user
message; a list holds messages whose content is a string or
``input_text``/``output_text`` parts, ``function_call`` items, which become the
tool calls of the assistant message before them or of a new one, and
``function_call_output`` items, which become tool messages). Requests sharing
instructions and earlier input then share blocks and route together, an agent's
turns on their whole history (token ids identical to vLLM 0.32's
``/v1/responses/render`` on seven shapes). Other item types (reasoning, built-in
tools' calls) have no chat form the gateway renders: routing reads the messages
before the first such item, and a request with none before it, like any body
whose shape the gateway does not know, has no prompt for routing and goes by
load (the replica still gets it unchanged, and answers it as vLLM does). An
image, audio or file part is kept as it is: routing reads the messages
before the one holding it (``gateway.prompt.bounds``, counted as ``media``).

An Anthropic Messages API body (``/v1/messages``, which vLLM serves by turning it
into a chat request) renders as that chat request: ``system`` (a string, or its
text blocks but a per-request billing header's, and the text of any system-role
message) joined into one system message, ``tools`` as functions (``input_schema``
the parameters), then the messages as vLLM converts them: an assistant's tool uses
as its tool calls, a user's tool results as tool messages, read up to the first
``thinking`` block (an image stops it one message earlier, as ``media``). An agent's
turns (Claude Code's loop of tool calls) then route on their whole history: checked
against vLLM 0.32, the gateway's rendering has vLLM's own token count on seven shapes
of tool loops, and its matched tokens equal the replica's cache read at each turn.
"""

from __future__ import annotations

import json
from typing import Any

_TEXT_PARTS = ("input_text", "output_text", "text")
_CHAT_FIELDS = ("cache_salt", "chat_template_kwargs")


def prompt_of(kind: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """``(render kind, body to render)`` for a prompt-bearing body, or None."""
    if kind == "chat":
        return ("chat", body) if _is_chat(body.get("messages")) else None
    if kind == "completions":
        return ("completions", body) if _is_prompt(body.get("prompt")) else None
    if kind == "responses":
        messages = responses_messages(body)
        if messages is None:
            return None
        chat = {"messages": messages, **{f: body[f] for f in _CHAT_FIELDS if f in body}}
        tools = _responses_tools(body.get("tools"))
        if tools:
            chat["tools"] = tools
        return "chat", chat
    if kind == "messages":
        return anthropic_chat(body)
    if kind == "chat_batch":
        return _first_conversation(body)
    if kind == "generate":
        ids = body.get("token_ids")
        if not (isinstance(ids, list) and ids and all(map(_is_token, ids))):
            return None
        return "completions", {"prompt": ids, **{f: body[f] for f in _CHAT_FIELDS if f in body}}
    if kind == "invocations":  # SageMaker: vLLM serves the body by its shape
        if "messages" in body:
            return prompt_of("chat", body)
        return prompt_of("completions", body) if "prompt" in body else None
    return None


def _first_conversation(body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """A batch of chats (``/v1/chat/completions/batch``: ``messages`` a list of
    conversations) routes by its first one, as a batch of completions prompts does."""
    batch = body.get("messages")
    if not isinstance(batch, list) or not batch or not _is_chat(batch[0]):
        return None
    chat = {key: value for key, value in body.items() if key != "messages"}
    return "chat", {**chat, "messages": batch[0]}


_BILLING_HEADER = "x-anthropic-billing-header"
"""A text block Claude Code puts in ``system`` with a per-request hash in it; vLLM leaves
it out of the prompt, so routing does too."""


def anthropic_chat(body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """An Anthropic Messages API body as the chat request routing renders, or None."""
    given = body.get("messages")
    if not isinstance(given, list) or not given:
        return None
    system: list[str] = []
    _system_text(body.get("system"), system)
    for message in given:
        if isinstance(message, dict) and message.get("role") == "system":
            _system_text(message.get("content"), system)
    messages: list[dict[str, Any]] = []
    if system:
        messages.append({"role": "system", "content": "".join(system)})
    for message in given:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            return None
        if message["role"] == "system":
            continue
        converted = _anthropic_message(message["role"], message.get("content"))
        if converted is None:
            break  # thinking, or a block vLLM turns into no chat form: routing reads before
        messages.extend(converted)
    if not messages:
        return None
    chat: dict[str, Any] = {"messages": messages}
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        chat["tools"] = [_anthropic_tool(tool) for tool in tools]
    for field in _CHAT_FIELDS:
        if field in body:
            chat[field] = body[field]
    return "chat", chat


def _system_text(value: Any, into: list[str]) -> None:
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, list):
        for block in value:
            if (isinstance(block, dict) and block.get("type") == "text"
                    and isinstance(block.get("text"), str) and block["text"]
                    and not block["text"].startswith(_BILLING_HEADER)):
                into.append(block["text"])


def _anthropic_message(role: str, content: Any) -> list[dict[str, Any]] | None:
    """One Anthropic message as the chat messages vLLM turns it into
    (``vllm/entrypoints/anthropic/serving.py``): text blocks as text (one alone as a
    string), images kept as they are (routing stops before the message that holds one,
    counted as ``media``: ``gateway.prompt.bounds``), an assistant's ``tool_use`` blocks as
    its tool calls (the input as JSON arguments), a user's ``tool_result`` blocks as tool
    messages before its own text, ``redacted_thinking`` and ``tool_reference`` blocks
    left out as vLLM leaves them; None (routing reads the messages before it) for a
    ``thinking`` block (vLLM hands it to the template as reasoning, which routing does not
    render), a tool result holding anything but text, or a block of no known type."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        return None
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "image":
            parts.append(block)
        elif kind == "text" and isinstance(block.get("text"), str):
            if block["text"]:
                parts.append({"type": "text", "text": block["text"]})
        elif kind == "tool_use" and role == "assistant" and isinstance(block.get("id"), str):
            calls.append({"id": block["id"], "type": "function", "function": {
                "name": block.get("name") or "",
                "arguments": json.dumps(block.get("input") or {})}})
        elif kind == "tool_result" and role == "user":
            text = _tool_result_text(block.get("content"))
            if text is None:
                return None
            results.append({"role": "tool", "tool_call_id": block.get("tool_use_id") or "",
                            "content": text})
        elif kind not in ("redacted_thinking", "tool_reference"):
            return None
    message: dict[str, Any] = {"role": role}
    if calls:
        message["tool_calls"] = calls
    if len(parts) == 1 and parts[0]["type"] == "text":
        message["content"] = parts[0]["text"]
    elif parts:
        message["content"] = parts
    if role == "user" and "content" not in message:
        return results  # only tool results: vLLM sends no user message after them
    return [*results, message]


def _tool_result_text(content: Any) -> str | None:
    """A tool result's text as vLLM makes its tool message (its text items joined by new
    lines); None when it holds an image or a tool reference, which vLLM turns into
    messages of their own."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        return None
    texts = []
    for item in content:
        if not isinstance(item, dict) or item.get("type") != "text":
            return None
        texts.append(str(item.get("text", "")))
    return "\n".join(texts)


def _anthropic_tool(tool: Any) -> Any:
    if not isinstance(tool, dict):
        return tool
    return {"type": "function", "function": {
        "name": tool.get("name"), "description": tool.get("description"),
        "parameters": tool.get("input_schema"), "strict": tool.get("strict"),
        "defer_loading": tool.get("defer_loading")}}


def responses_messages(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    """A Responses API body's ``instructions`` and ``input`` as chat messages."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for item in given:
            kind = item.get("type") if isinstance(item, dict) else None
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
                continue
            if kind == "function_call_output" and isinstance(item.get("call_id"), str):
                messages.append({"role": "tool", "content": item.get("output"),
                                 "tool_call_id": item["call_id"]})
                continue
            message = _message(item)
            if message is None:
                break  # no chat form: routing reads the messages before it
            messages.append(message)
    else:
        return None
    return messages or None


def _responses_tools(tools: Any) -> list[dict[str, Any]]:
    """A Responses body's function tools as the chat tools vLLM renders them with (flat
    ``{type, name, ...}`` to ``{type, function: {name, ...}}``; the renderer then keeps
    the fields vLLM keeps: ``engine.tokenizer.template_tools``). Built-in tools
    (``web_search``...) are not rendered by vLLM either."""
    if not isinstance(tools, list):
        return []
    return [{"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
            for tool in tools if isinstance(tool, dict) and tool.get("type") == "function"]


def _message(item: Any) -> dict[str, Any] | None:
    if not isinstance(item, dict) or item.get("type", "message") != "message":
        return None
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
        if part["type"] not in _TEXT_PARTS:
            parts.append(part)  # media: routing stops before this message
        elif isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        else:
            return None
    return {"role": role, "content": parts}


def _is_chat(messages: Any) -> bool:
    return isinstance(messages, list) and bool(messages) and all(map(_is_message, messages))


def _is_message(message: Any) -> bool:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        return False
    content = message.get("content")
    return (content is None or isinstance(content, str)
            or (isinstance(content, list) and all(isinstance(p, dict) for p in content)))


def _is_prompt(prompt: Any) -> bool:
    if isinstance(prompt, str):
        return True
    if not isinstance(prompt, list) or not prompt:
        return False
    first = prompt[0]
    if isinstance(first, list):
        return bool(first) and all(_is_token(t) for t in first)
    return isinstance(first, str) or all(_is_token(t) for t in prompt)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
