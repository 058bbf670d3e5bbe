"""``GET /openapi.json``: the gateway's routes, with the bodies they really take.

The relayed routes are served by the front door, not by FastAPI
(``gateway.request.front``): they are documented as FastAPI documents a route
(``DocumentedApi``). They read the raw body themselves (the bytes are
forwarded as sent), so FastAPI cannot see its shape; it is written here, as
OpenAI's API and vLLM's server define it: the fields the gateway reads for
routing (``model``, ``messages``, ``prompt``, ``stream``, ``user``,
``cache_salt``, ``tools``, ``chat_template_kwargs``) and the common sampling
fields, with ``additionalProperties`` open because every other field goes to
the replica unchanged. Every error is the OpenAI error object
(``ErrorResponse``). A POST route not described here is documented as
taking a JSON object. The fuzz stage (``tests/integration/test_fuzz.py``)
generates its requests from this document.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.routing import BaseRoute

from gateway.request.exchange import Route

JSON = dict[str, Any]


def _ref(name: str) -> JSON:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: JSON) -> JSON:
    return {"anyOf": [schema, {"type": "null"}]}


_TEXT_PART: JSON = {"type": "object", "required": ["type", "text"], "additionalProperties": True,
                    "properties": {"type": {"type": "string", "enum": ["text"]},
                                   "text": {"type": "string"}}}

_SAMPLING: JSON = {
    "model": {"type": "string"},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "additionalProperties": True,
                       "properties": {"include_usage": {"type": "boolean"}}},
    "max_tokens": {"type": "integer", "minimum": 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
    "n": {"type": "integer", "minimum": 1, "maximum": 8},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "seed": {"type": "integer"},
    "user": {"type": "string"},
    "cache_salt": {"type": "string"},
}

SCHEMAS: dict[str, JSON] = {
    "ErrorResponse": {
        "type": "object", "required": ["error"],
        "properties": {"error": {
            "type": "object", "required": ["message", "type", "param", "code"],
            "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                           "param": _nullable({"type": "string"}),
                           "code": {"anyOf": [{"type": "string"}, {"type": "integer"},
                                              {"type": "null"}]}}}}},
    "ChatMessage": {
        "type": "object", "required": ["role"], "additionalProperties": True,
        "properties": {
            "role": {"type": "string", "enum": ["system", "developer", "user", "assistant",
                                                "tool"]},
            "content": {"anyOf": [{"type": "string"}, {"type": "array", "items": _TEXT_PART},
                                  {"type": "null"}]},
            "name": {"type": "string"},
            "tool_call_id": {"type": "string"},
            "tool_calls": {"type": "array", "items": {"type": "object",
                                                      "additionalProperties": True}}}},
    "ChatCompletionRequest": {
        "type": "object", "required": ["messages"], "additionalProperties": True,
        "properties": {
            **_SAMPLING,
            "messages": {"type": "array", "minItems": 1, "items": _ref("ChatMessage")},
            "max_completion_tokens": {"type": "integer", "minimum": 1},
            "tools": {"type": "array", "items": {"type": "object", "additionalProperties": True}},
            "tool_choice": {"anyOf": [{"type": "string"}, {"type": "object"}]},
            "chat_template": {"type": "string"},
            "chat_template_kwargs": {"type": "object", "additionalProperties": True},
            "add_generation_prompt": {"type": "boolean"},
            "continue_final_message": {"type": "boolean"}}},
    "CompletionRequest": {
        "type": "object", "required": ["prompt"], "additionalProperties": True,
        "properties": {
            **_SAMPLING,
            "prompt": {"anyOf": [
                {"type": "string"},
                {"type": "array", "items": {"type": "string"}, "minItems": 1},
                {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1},
                {"type": "array", "minItems": 1,
                 "items": {"type": "array", "items": {"type": "integer", "minimum": 0}}}]},
            "echo": {"type": "boolean"},
            "logprobs": {"type": "integer", "minimum": 0}}},
    "JSONObject": {"type": "object", "additionalProperties": True},
    "AnthropicErrorResponse": {
        "type": "object", "required": ["type", "error"],
        "properties": {"type": {"type": "string", "enum": ["error"]}, "error": {
            "type": "object", "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}}},
}

BODIES = {"/v1/chat/completions": "ChatCompletionRequest",
          "/v1/chat/completions/render": "ChatCompletionRequest",
          "/v1/completions": "CompletionRequest",
          "/v1/completions/render": "CompletionRequest",
          "/v1/prompt/lint": "ChatCompletionRequest"}
"""The routes whose body is described above; other POST routes take ``JSONObject``."""


def build_openapi(app: FastAPI, relayed: Sequence[BaseRoute] = (),
                  anthropic: Collection[str] = ()) -> JSON:
    """``app``'s document, the ``relayed`` routes first (as the gateway matches them);
    on the ``anthropic`` paths the gateway's errors are Anthropic-shaped but for an
    unreadable body (``gateway.errors``)."""
    schema = get_openapi(title=app.title, version=app.version, routes=[*relayed, *app.routes])
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(SCHEMAS)
    openai = {"description": "An OpenAI-shaped error",
              "content": {"application/json": {"schema": _ref("ErrorResponse")}}}
    either = {"description": "An Anthropic-shaped error, or an OpenAI-shaped one for a body "
                             "that cannot be read (as vLLM answers)",
              "content": {"application/json": {"schema": {"anyOf": [
                  _ref("AnthropicErrorResponse"), _ref("ErrorResponse")]}}}}
    for path, operations in schema.get("paths", {}).items():
        error = either if path in anthropic else openai
        for method, operation in operations.items():
            operation.setdefault("responses", {})["4XX"] = error
            operation["responses"]["5XX"] = error
            if method == "post" and "requestBody" not in operation:
                operation["requestBody"] = {"required": True, "content": {
                    "application/json": {"schema": _ref(BODIES.get(path, "JSONObject"))}}}
    return schema


def relayed_operation(route: Route) -> APIRoute:
    """A relayed route as FastAPI documents one (its operation id: ``chat_post_...``).
    Only the document reads it: the front door serves the route
    (``gateway.request.front``), so its endpoint never runs."""

    async def endpoint(request: Request) -> Response:
        raise NotImplementedError("relayed routes are served by gateway.request.front")

    endpoint.__name__ = f"{route.kind}_{route.method.lower()}"
    return APIRoute(route.path, endpoint, methods=[route.method])


class DocumentedApi(FastAPI):
    """FastAPI whose ``/openapi.json`` is :func:`build_openapi`: its own routes and the
    ``relayed`` ones, with the bodies they really take (built once, when first asked)."""

    def __init__(self, relayed: Sequence[Route], **options: Any) -> None:
        super().__init__(**options)
        self.relayed_operations = [relayed_operation(route) for route in relayed]
        self.anthropic_paths = {route.path for route in relayed if route.errors == "anthropic"}

    def openapi(self) -> JSON:
        if self.openapi_schema is None:
            self.openapi_schema = build_openapi(self, self.relayed_operations,
                                                self.anthropic_paths)
        return self.openapi_schema
