"""Response and stream-chunk objects shaped exactly like vLLM's.

Checked against ``vllm/entrypoints/openai/chat_completion/{protocol,serving}.py``,
``completion/{protocol,serving}.py`` and ``engine/protocol.py``:

* Full responses are ``model_dump()`` of the pydantic model: every field is
  present, ``None`` included (``refusal``, ``annotations``, ``audio``,
  ``function_call``, ``tool_calls: []``, ``reasoning`` in a chat message;
  ``stop_reason``, ``token_ids``, ``logprobs`` in a choice; ``service_tier``,
  ``system_fingerprint``, ``prompt_logprobs``, ``prompt_token_ids``,
  ``kv_transfer_params`` at the top).
* Chat chunks are ``model_dump_json(exclude_unset=True)``: only fields the
  server set. The first chunk of each choice carries
  ``delta: {"role": "assistant", "content": "", "reasoning_content": null}``
  and ``prompt_token_ids: null``; content chunks add ``token_ids: null``;
  the finishing chunk adds ``finish_reason`` and ``stop_reason``. The
  ``reasoning_content: null`` comes from ``DeltaMessage``'s compatibility
  validator, which assigns it and so marks it as set.
* Completion chunks are ``model_dump_json(exclude_unset=False)``: all fields.
* The usage-only chunk (``include_usage``) has ``choices: []`` and is dumped
  with ``exclude_none=True``.

Unlike vLLM, ``prompt_tokens_details.cached_tokens`` is always reported
(vLLM needs ``--enable-prompt-tokens-details`` and omits a zero count).
"""

from __future__ import annotations

from typing import Any

import orjson


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None
        if cached_tokens is None
        else {"cached_tokens": cached_tokens},
    }


def chat_message(content: str) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "tool_calls": [],
        "reasoning": None,
    }


def chat_choice(
    index: int, content: str, finish_reason: str, stop_reason: str | None
) -> dict[str, Any]:
    return {
        "index": index,
        "message": chat_message(content),
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": None,
    }


def chat_completion(
    request_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage_info: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage_info,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "kv_transfer_params": None,
    }


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def chat_chunk(
    request_id: str,
    created: int,
    model: str,
    choice: dict[str, Any],
    usage_info: dict[str, Any] | None = None,
    first: bool = False,
) -> bytes:
    chunk: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [choice],
    }
    if usage_info is not None:
        chunk["usage"] = usage_info
    if first:
        chunk["prompt_token_ids"] = None
    return sse(chunk)


def chat_role_choice(index: int) -> dict[str, Any]:
    return {
        "index": index,
        "delta": {"role": "assistant", "content": "", "reasoning_content": None},
        "logprobs": None,
        "finish_reason": None,
    }


def chat_delta_choice(
    index: int, text: str, finish_reason: str | None, stop_reason: str | None
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": index,
        "delta": {"content": text, "reasoning_content": None},
        "logprobs": None,
        "finish_reason": finish_reason,
    }
    if finish_reason is not None:
        choice["stop_reason"] = stop_reason
    choice["token_ids"] = None
    return choice


def continuous_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """Per-chunk usage of ``continuous_usage_stats`` (no details are set)."""
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def usage_chunk(
    request_id: str, created: int, model: str, obj: str, usage_info: dict[str, Any]
) -> bytes:
    compact = {key: value for key, value in usage_info.items() if value is not None}
    return sse(
        {
            "id": request_id,
            "object": obj,
            "created": created,
            "model": model,
            "choices": [],
            "usage": compact,
        }
    )


def completion_choice(
    index: int, text: str, finish_reason: str | None, stop_reason: str | None
) -> dict[str, Any]:
    return {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
    }


def completion(
    request_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage_info: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": request_id,
        "object": "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "service_tier": None,
        "system_fingerprint": None,
        "usage": usage_info,
        "kv_transfer_params": None,
    }


def completion_chunk(
    request_id: str,
    created: int,
    model: str,
    index: int,
    text: str,
    finish_reason: str | None,
    stop_reason: str | None,
    usage_info: dict[str, Any] | None,
) -> bytes:
    choice = {
        "index": index,
        "text": text,
        "logprobs": None,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "prompt_token_ids": None,
        "token_ids": None,
    }
    if usage_info is not None:
        usage_info = {**usage_info, "prompt_tokens_details": None}
    return sse(
        {
            "id": request_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [choice],
            "usage": usage_info,
        }
    )
