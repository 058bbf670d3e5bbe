"""Request parsing and validation for the simulated OpenAI server.

Bodies are plain JSON objects; unknown fields are accepted and ignored, as
vLLM's ``OpenAIBaseModel`` (``extra="allow"``) does. What vLLM rejects is
rejected the same way, at the same layer:

* shape errors that vLLM's pydantic models catch (wrong types, missing
  ``messages``/``prompt``, ``stream_options`` without ``stream``, empty
  ``cache_salt``, malformed JSON, wrong content type) become a
  ``RequestValidationError``-style error: status 400, ``type`` "Bad Request",
  ``param`` the dotted field path, message ``"1 validation error:\\n  {...}"``;
* errors vLLM's serving layer raises (``n``/``max_tokens`` out of range,
  prompt longer than the context, untrusted chat template) are status 400,
  ``type`` "BadRequestError";
* an unknown model is status 404, ``type`` "NotFoundError", ``param`` "model".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.api_shapes import read_json


class SimError(Exception):
    """An OpenAI-shaped error: ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, err_type: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.err_type,
                "param": self.param,
                "code": self.status,
            }
        }


def bad_request(message: str, param: str | None = None) -> SimError:
    return SimError(400, message, "BadRequestError", param)


def not_found_model(model: str, served: str) -> SimError:
    return SimError(404, f"The model `{model}` does not exist. Valid aliases: {served}.",
                    "NotFoundError", "model")


def validation_error(
    loc: tuple[str | int, ...], msg: str, value: Any = None, kind: str = "value_error"
) -> SimError:
    path = ".".join(str(part) for part in ("body", *loc))
    shown = (
        value
        if isinstance(value, (str, int, float, bool)) or value is None
        else f"<{type(value).__name__}>"
    )
    detail = {"type": kind, "loc": path, "msg": msg, "input": shown}
    return SimError(400, f"1 validation error:\n  {detail}", "Bad Request", path)


def parse_json_object(raw: bytes, content_type: str) -> dict[str, Any]:
    media_type = content_type.split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise SimError(
            400,
            "1 validation error:\n  {'loc': 'header.content-type', 'msg': "
            "\"Unsupported Media Type: Only 'application/json' is allowed\", 'type': 'value_error'}",
            "Bad Request",
            "header.content-type",
        )
    try:
        data = read_json(raw)
    except (ValueError, RecursionError) as exc:
        raise validation_error((0,), "JSON decode error", None, "json_invalid") from exc
    if not isinstance(data, dict):
        raise validation_error(
            (), "Input should be a valid dictionary or object", data, "model_attributes_type"
        )
    return data


def _int(body: Mapping[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise validation_error((name,), "Input should be a valid integer", value, "int_type")
    return value


def _bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise validation_error((name,), "Input should be a valid boolean", value, "bool_type")
    return value


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value else ()
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(item for item in value if item)
    raise validation_error(
        ("stop",), "Input should be a valid string or list of strings", value, "string_type"
    )


@dataclass(frozen=True, slots=True)
class SamplingRequest:
    """The generation options the simulator honours (others are accepted, ignored)."""

    model: str | None
    n: int
    max_tokens: int | None
    min_tokens: int
    ignore_eos: bool
    stop: tuple[str, ...]
    include_stop_str_in_output: bool
    seed: int | None
    stream: bool
    include_usage: bool
    continuous_usage_stats: bool
    cache_salt: str | None
    echo: bool
    logprobs: int | None = None
    """Top alternatives per output token (chat: ``top_logprobs`` when ``logprobs``
    is true; completions: ``logprobs``); ``None``: no logprobs."""


MAX_LOGPROBS = 20
"""vLLM's default ``--max-logprobs``."""


def _logprobs(body: Mapping[str, Any], chat: bool) -> int | None:
    if chat:
        top = _int(body, "top_logprobs", None)
        if top is not None and top < 0 and top != -1:
            raise validation_error(
                (), "Value error, `top_logprobs` must be a positive value or -1.", top
            )
        wanted = _bool(body, "logprobs", False)
        if top is not None and top != 0 and not wanted:
            raise validation_error(
                (), "Value error, when using `top_logprobs`, `logprobs` must be set to true."
            )
        count = (top or 0) if wanted else None
    else:
        count = _int(body, "logprobs", None)
        if count is not None and count < 0 and count != -1:
            raise bad_request(f"logprobs must be non-negative or -1, got {count}.", "logprobs")
    if count is not None and (count == -1 or count > MAX_LOGPROBS):
        shown = "the vocabulary" if count == -1 else count
        raise bad_request(
            f"Requested sample logprobs of {shown}, which is greater than max allowed: "
            f"{MAX_LOGPROBS}",
            "logprobs",
        )
    return count


def parse_sampling(body: Mapping[str, Any], chat: bool) -> SamplingRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise validation_error(("model",), "Input should be a valid string", model, "string_type")
    stream = _bool(body, "stream", False)
    stream_options = body.get("stream_options")
    include_usage = continuous = False
    if stream_options is not None:
        if not isinstance(stream_options, Mapping):
            raise validation_error(
                ("stream_options",), "Input should be a valid dictionary", stream_options
            )
        if not stream:
            raise validation_error(
                (), "Value error, Stream options can only be defined when `stream=True`.", None
            )
        # vLLM's StreamOptions defaults include_usage to True.
        include_usage = _bool(stream_options, "include_usage", True)
        continuous = include_usage and _bool(stream_options, "continuous_usage_stats", False)
    cache_salt = body.get("cache_salt")
    if cache_salt is not None and (not isinstance(cache_salt, str) or not cache_salt):
        raise validation_error(
            (),
            "Value error, Parameter 'cache_salt' must be a non-empty string if provided.",
            cache_salt,
        )
    max_tokens = _int(body, "max_tokens", None)
    if chat:
        max_tokens = _int(body, "max_completion_tokens", None) or max_tokens
    n = _int(body, "n", 1)
    assert n is not None
    if n < 1:
        raise bad_request(f"n must be at least 1, got {n}.", "n")
    echo = _bool(body, "echo", False)
    # A completion that only echoes its prompt (lm-eval's log-likelihoods) may
    # ask for no tokens: vLLM runs it with one and sends back the prompt alone.
    echo_only = not chat and echo and max_tokens == 0
    if max_tokens is not None and max_tokens < 1 and not echo_only:
        raise bad_request(f"max_tokens must be at least 1, got {max_tokens}.", "max_tokens")
    min_tokens = _int(body, "min_tokens", 0) or 0
    seed = _int(body, "seed", None)
    return SamplingRequest(
        model=model,
        n=n,
        max_tokens=max_tokens,
        min_tokens=max(min_tokens, 0),
        ignore_eos=_bool(body, "ignore_eos", False),
        stop=_stop(body),
        include_stop_str_in_output=_bool(body, "include_stop_str_in_output", False),
        seed=seed,
        stream=stream,
        include_usage=include_usage,
        continuous_usage_stats=continuous,
        cache_salt=cache_salt,
        echo=echo,
        logprobs=_logprobs(body, chat),
    )


def require_messages(body: Mapping[str, Any]) -> list[Any]:
    messages = body.get("messages")
    if messages is None:
        raise validation_error(("messages",), "Field required", None, "missing")
    if not isinstance(messages, list):
        raise validation_error(("messages",), "Input should be a valid list", messages, "list_type")
    for position, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise validation_error(
                ("messages", position), "Input should be a message with a role", message
            )
    return messages


def refuse_request_template(body: Mapping[str, Any]) -> None:
    kwargs = body.get("chat_template_kwargs")
    if body.get("chat_template") is not None or (
        isinstance(kwargs, Mapping) and kwargs.get("chat_template") is not None
    ):
        raise bad_request(
            "Chat template is passed with request, but --trust-request-chat-template is not set. "
            "Refused request with untrusted chat template."
        )


Prompt = str | list[int]


def parse_prompts(body: Mapping[str, Any]) -> list[Prompt]:
    """The completion prompt forms vLLM accepts: str, [str], [int], [[int]]."""
    prompt = body.get("prompt")
    if prompt is None:
        raise validation_error(
            (), "Value error, Either prompt or prompt_embeds must be provided and non-empty.", None
        )
    if isinstance(prompt, str):
        prompts: list[Prompt] = [prompt]
    elif isinstance(prompt, list) and prompt and all(isinstance(item, str) for item in prompt):
        prompts = list(prompt)
    elif isinstance(prompt, list) and prompt and all(_is_token(item) for item in prompt):
        prompts = [list(prompt)]
    elif (
        isinstance(prompt, list)
        and prompt
        and all(
            isinstance(item, list) and item and all(_is_token(t) for t in item) for item in prompt
        )
    ):
        prompts = [list(item) for item in prompt]
    else:
        raise validation_error(
            ("prompt",), "Input should be a string, a list of strings or token ids", prompt
        )
    if any(item == "" for item in prompts):
        raise bad_request("Prompt cannot be empty", "prompt")
    return prompts


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_length(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int) -> int:
    """vLLM's context-length checks; returns the effective ``max_tokens``."""
    if num_prompt_tokens >= max_model_len:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"request has {num_prompt_tokens} input tokens. Please reduce the length of the "
            "input messages.",
            "input_tokens",
        )
    if max_tokens is None:
        return max_model_len - num_prompt_tokens
    if num_prompt_tokens + max_tokens > max_model_len:
        raise bad_request(
            f"'max_tokens' or 'max_completion_tokens' is too large: {max_tokens}. This model's "
            f"maximum context length is {max_model_len} tokens and your request has "
            f"{num_prompt_tokens} input tokens ({max_tokens} > {max_model_len} - {num_prompt_tokens}).",
            "max_tokens",
        )
    return max_tokens
