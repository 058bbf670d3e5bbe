"""What the gateway reads from a request body at the HTTP edge.

The gateway is no stricter than vLLM: it rejects only what it must
understand to route — a body that is not JSON or not a JSON object, a
``model`` that is not a string (or missing while several models are
served: ``dispatch.resolve_model``), a body over the size limit. Every other
field, of whatever type or value (a custom role such as ``ipython``,
``max_tokens=0`` with ``echo``, a completion with only ``prompt_embeds``,
``n`` above 128), goes to the replica in the bytes the client sent, and the
replica answers it as vLLM does. A field routing would like but that has an
odd type (``user``, ``stream``) is read as absent.

The pydantic models below are the chat request's shape as the prompt
linter's own API checks it (``gateway.server.lint_routes``); extra fields are kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.api_shapes import read_json
from gateway.errors import InvalidRequest

_TRUE = frozenset({"true", "1", "yes", "on", "t", "y"})
"""What pydantic's lax ``bool`` (vLLM's ``stream``) reads as true in a string."""


@dataclass(frozen=True, slots=True)
class RoutingFields:
    """The fields of a body routing reads (each None/False when absent or odd)."""

    model: str | None = None
    stream: bool = False
    user: str | None = None
    max_tokens: int = 0
    """``max_completion_tokens``, ``max_tokens`` or ``max_output_tokens`` (Responses):
    the answer's length limit, 0 when none is set (or it is not a positive integer)."""


_OUTPUT_LIMITS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


def routing_fields(data: Mapping[str, Any]) -> RoutingFields:
    """Read ``model``, ``stream``, ``user`` and the output limit; a non-string ``model``
    is a 400 (the rest is the replica's to judge)."""
    model = data.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("model: Input should be a valid string", param="model")
    user = data.get("user")
    limit = next((v for v in map(data.get, _OUTPUT_LIMITS)
                  if isinstance(v, int) and not isinstance(v, bool) and v > 0), 0)
    return RoutingFields(model=model or None, stream=flag(data.get("stream")),
                         user=user if isinstance(user, str) else None, max_tokens=limit)


def flag(value: Any) -> bool:
    """A boolean the way vLLM's pydantic models read one (JSON, form field or query)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value == 1
    return isinstance(value, str) and value.strip().lower() in _TRUE


def parse_json(raw: bytes, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The body as vLLM reads it (``engine.api_shapes.read_json``: a ``NaN`` in
    ``metadata``, a tool schema's ``Infinity`` bound or a byte order mark is no error
    there).

    A body neither reads is a 400 saying why: not UTF-8, or, when the client's
    ``headers`` name a content encoding (a gzip body), that bodies are read uncompressed (as vLLM
    reads them; its own answer, "There was an error parsing the body", says neither)."""
    if not raw.strip():
        raise InvalidRequest("request body is empty; expected a JSON object")
    try:
        data = read_json(raw)
    except (ValueError, RecursionError) as exc:
        coding = (headers or {}).get("content-encoding", "")  # looked up only here
        raise InvalidRequest(_unreadable(exc, coding)) from None
    if not isinstance(data, dict):
        raise InvalidRequest("request body must be a JSON object")
    return data


def _unreadable(exc: Exception, content_encoding: str) -> str:
    coding = content_encoding.strip().lower()
    if coding and coding != "identity":
        return (f"request body is not valid JSON: it came with Content-Encoding "
                f"'{content_encoding.strip()}', and request bodies are read uncompressed; "
                "send it without one")
    if isinstance(exc, UnicodeDecodeError):
        return f"request body is not valid UTF-8 JSON: {exc}"
    return f"request body is not valid JSON: {exc}"


class Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class Message(Open):
    role: str
    content: str | list[Any] | None = None
    name: str | None = None


class ChatBody(Open):
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    user: str | None = None
    cache_salt: str | None = None


def validate(model_cls: type[BaseModel], data: dict[str, Any]) -> BaseModel:
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
