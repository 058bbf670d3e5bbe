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

from typing import Any

from engine.api_shapes import CHAT_FIELDS, anthropic_chat, responses_messages, responses_tools


def prompt_of(kind: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
    """``(render kind, body to render)`` for a prompt-bearing body, or None."""
    if kind == "chat":
        return ("chat", body) if _is_chat(body.get("messages")) else None
    if kind == "completions":
        return ("completions", body) if _is_prompt(body.get("prompt")) else None
    if kind == "responses":
        messages, _ = responses_messages(body)
        if not messages:
            return None
        chat = {"messages": messages, **{f: body[f] for f in CHAT_FIELDS if f in body}}
        reasoning = body.get("reasoning")
        if isinstance(reasoning, dict) and reasoning.get("effort") is not None:
            chat["reasoning_effort"] = reasoning["effort"]  # what vLLM hands the template
        tools = responses_tools(body.get("tools"))
        if tools:
            chat["tools"] = tools
        return "chat", chat
    if kind == "messages":
        converted = anthropic_chat(body)  # the linter reads it so too (gateway.lint.shapes)
        return None if converted is None else ("chat", converted)
    if kind == "chat_batch":
        return _first_conversation(body)
    if kind == "generate":
        ids = body.get("token_ids")
        if not (isinstance(ids, list) and ids and all(map(_is_token, ids))):
            return None
        return "completions", {"prompt": ids, **{f: body[f] for f in CHAT_FIELDS if f in body}}
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
