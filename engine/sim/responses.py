"""Response and stream-chunk objects shaped exactly like vLLM's.

Checked against ``vllm/entrypoints/openai/chat_completion/{protocol,serving}.py``,
``completion/{protocol,serving}.py`` and ``engine/protocol.py``:

* Full responses are ``model_dump()`` of the pydantic model: every field is
  present, ``None`` included (``refusal``, ``annotations``, ``audio``,
  ``function_call``, ``reasoning`` in a chat message, and ``tool_calls`` only
  when there are some, as ``ChatMessage``'s serializer drops an empty list;
  ``stop_reason``, ``token_ids``, ``routed_experts``, ``logprobs`` in a
  choice; ``service_tier``, ``system_fingerprint``, ``prompt_logprobs``,
  ``prompt_token_ids``, ``prompt_text``, ``kv_transfer_params``,
  ``ec_transfer_params``, ``metrics`` at the top), as captured from vLLM 0.32
  in ``tests/fixtures/vllm``.
* Chat chunks are ``model_dump_json(exclude_unset=True)``: only fields the
  server set. The first chunk of each choice carries
  ``delta: {"role": "assistant", "content": ""}`` and ``prompt_token_ids``,
  ``prompt_text`` (null); content chunks add ``token_ids: null``; the
  finishing chunk adds ``finish_reason`` and ``stop_reason``. Tool-call
  deltas are built by ``engine.sim.chat_choice``.
* Completion chunks are ``model_dump_json(exclude_unset=False)``: all fields.
* The usage-only chunk (``include_usage``) has ``choices: []`` and is dumped
  with ``exclude_none=True``.
* Logprobs: chat ``{"content": [{token, logprob, bytes, top_logprobs: [...]}]}``,
  completions ``{text_offset, token_logprobs, tokens, top_logprobs}``
  (``engine.sim.logprobs``).

``prompt_tokens_details`` is always reported, as vLLM 0.32 does with
``--enable-prompt-tokens-details`` (the launch profiles turn it on):
``cached_tokens`` (the prefix cache's hit) and, on chat,
``created_cache_tokens`` (what the prefill wrote to it: ``created_cache_tokens``
below).
"""

from __future__ import annotations

from typing import Any

import orjson


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None,
          created_tokens: int | None = None) -> dict[str, Any]:
    details: dict[str, Any] | None = None
    if cached_tokens is not None:
        details = {"cached_tokens": cached_tokens}
        if created_tokens is not None:
            details["created_cache_tokens"] = created_tokens
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": details,
    }


def created_cache_tokens(prompt_tokens: int, cached_tokens: int, block_size: int) -> int:
    """What vLLM 0.32 reports on chat as ``created_cache_tokens`` (Anthropic's
    ``cache_creation_input_tokens``): the prompt's tokens in full blocks, which its
    prefill leaves in the prefix cache, less those it found there. Seen on vLLM 0.32 on
    CPU (128-token blocks): a new 384-token chat prompt 384, the same again 128 (256
    found: a hit never reaches the last token, so its block is written again); 256 of a
    new 257-token one. vLLM's completions leave it unset."""
    return max(0, prompt_tokens // block_size * block_size - cached_tokens)


SYSTEM_FINGERPRINT = "vllm-0.32.0-5e1a7c0d"
"""vLLM 0.32 reports ``vllm-<version>-<hex>``; this is the simulator's."""


def chat_message(
    content: str | None, tool_calls: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if tool_calls:
        message["tool_calls"] = tool_calls
    message["reasoning"] = None
    return message


def chat_choice(
    index: int,
    message: dict[str, Any],
    finish_reason: str,
    stop_reason: str | None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": None,
        "routed_experts": None,
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
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": usage_info,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
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
    fingerprint: bool = False,
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
        chunk["prompt_text"] = None
    if fingerprint:  # the last chunk, when no usage chunk follows
        chunk["system_fingerprint"] = SYSTEM_FINGERPRINT
    return sse(chunk)


def chat_role_choice(index: int, role: str = "assistant") -> dict[str, Any]:
    return {
        "index": index,
        "delta": {"role": role, "content": ""},
        "logprobs": None,
        "finish_reason": None,
    }


def chat_delta_choice(
    index: int,
    delta: dict[str, Any],
    finish_reason: str | None,
    stop_reason: str | None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    choice: dict[str, Any] = {
        "index": index,
        "delta": delta,
        "logprobs": logprobs,
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
            "system_fingerprint": SYSTEM_FINGERPRINT,
        }
    )


def completion_choice(
    index: int,
    text: str,
    finish_reason: str | None,
    stop_reason: str | None,
    logprobs: dict[str, Any] | None = None,
) -> dict[str, Any]:
    return {
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": None,
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "routed_experts": None,
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
        "system_fingerprint": SYSTEM_FINGERPRINT,
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
    logprobs: dict[str, Any] | None = None,
) -> bytes:
    choice = {
        "index": index,
        "text": text,
        "logprobs": logprobs,
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
