"""What prompt a request body carries, as routing renders it.

Chat bodies (``/v1/chat/completions``, ``/v1/chat/completions/render``) and
completion bodies render as they are; a batch of chats
(``/v1/chat/completions/batch``) as its first conversation, a token-in-token-out
``/inference/v1/generate`` body as a completion of its ``token_ids``, SageMaker's
``/invocations`` as the chat or completion its shape makes it. A ``/v1/responses`` body is rendered
like the chat request vLLM turns it into: ``instructions`` as the system
message, then ``input`` (a string is one user message; a list holds
messages whose content is a string or ``input_text``/``output_text``
parts). Requests sharing instructions and earlier input then share blocks
and route together. Tool calls, their outputs and other item types have no
chat form the gateway renders: routing reads the messages before the first
such item (an agent's instructions and task, turn after turn of tool calls,
still route together), and a request with none before it, like any body
whose shape the gateway does not know, has no prompt for routing and goes by
load (the replica still gets it unchanged, and answers it as vLLM does). An
image, audio or file part is kept as it is: routing reads the messages
before the one holding it (``gateway.prompt.bounds``, counted as ``media``).

An Anthropic Messages API body (``/v1/messages``, which vLLM serves by turning it
into a chat request) renders as that chat request: ``system`` (a string, or its
text blocks but a per-request billing header's, and the text of any system-role
message) joined into one system message, ``tools`` as functions (``input_schema``
the parameters), then the messages, read up to the first block that is neither text nor an image
(a tool use, a tool result, thinking; an image stops it one message earlier, as
``media``): an agent's turns route on its system prompt, tools and task.
"""

from __future__ import annotations

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
        content = _anthropic_content(message.get("content"))
        if content is None:
            break  # a tool use, a tool result, thinking: routing reads what comes before
        messages.append({"role": message["role"], "content": content})
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


def _anthropic_content(content: Any) -> str | list[dict[str, Any]] | None:
    """A message's content as chat content: a string, or its text blocks as text parts
    and its images kept as they are (routing stops before the message that holds one,
    counted as ``media``: ``gateway.prompt.bounds``); None when it holds any other block."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    parts = []
    for block in content:
        if not isinstance(block, dict):
            return None
        if block.get("type") == "image":
            parts.append(block)
        elif block.get("type") == "text" and isinstance(block.get("text"), str):
            if block["text"]:
                parts.append({"type": "text", "text": block["text"]})
        else:
            return None
    if len(parts) == 1 and parts[0]["type"] == "text":
        return str(parts[0]["text"])
    return parts or None


def _anthropic_tool(tool: Any) -> Any:
    if not isinstance(tool, dict):
        return tool
    return {"type": "function", "function": {
        "name": tool.get("name"), "description": tool.get("description"),
        "parameters": tool.get("input_schema")}}


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
            message = _message(item)
            if message is None:
                break  # no chat form: routing reads the messages before it
            messages.append(message)
    else:
        return None
    return messages or None


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
