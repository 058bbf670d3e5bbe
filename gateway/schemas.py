"""The request bodies at the HTTP edge, validated with pydantic.

Only what the gateway must understand is typed; every other field is kept
(``extra="allow"``) because the body forwarded to the replica is the bytes
the client sent. A schema violation becomes a 400 in OpenAI's error shape
with the offending field as ``param``.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import InvalidRequest

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(Open):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class Message(Open):
    role: Role
    content: str | list[Any] | None = None
    name: str | None = None


class Sampling(Open):
    model: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = Field(None, ge=1, le=128)
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    user: str | None = None
    cache_salt: str | None = None
    seed: int | None = None


class ChatBody(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None


class CompletionBody(Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]


def parse_json(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise InvalidRequest("request body is empty; expected a JSON object")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    return data


def validate(model_cls: type[Sampling], data: dict[str, Any]) -> Sampling:
    try:
        return model_cls.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = json_path(err["loc"]) or None
        msg = "field required" if err["type"] == "missing" else err["msg"]
        raise InvalidRequest(f"{param}: {msg}" if param else msg, param=param) from None


def json_path(loc: tuple[int | str, ...] | list[int | str]) -> str:
    """pydantic's location as a JSON path: ``messages[0].content``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not part.startswith(("function-", "union[")) and part not in ("str", "list[any]"):
            out += f".{part}" if out else part
    return out
