"""One routed request, from the bytes the client sent to what it was answered.

An :class:`Exchange` is created by the gateway's front door for each request
to a relayed route, with what it was admitted with and the route's path
parameters (``gateway.request.front``), and filled in as the request moves
through the gateway, in this order::

    admit     the client key's grant (with client keys)        KeyStore.admit_request
    read      raw body (size-limited)                          body.read_body
    parse     JSON, edge validation, model, ids, forward body  Exchange.parse
    describe  the prompt's KV blocks (RouteRequest)             GatewayState.describe
    decide    the policy's Decision                            Dispatcher.decide
    forward   lease, send, failover, relay (Outcome)           Proxy.forward
    record    metrics, policy learning, access log             lifecycle observers

Each step reads what the earlier ones wrote and adds its own part; nothing
calls back into the front door. The prompt linter observes the exchange once
the request has left (``lint``), and never holds the answer back.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson
from starlette.requests import Request

from engine.backends.form_fields import form_fields
from gateway.auth.keys import Grant, estimate_tokens
from gateway.request.forwarding import SecretTest, forward_headers
from gateway.request.prompt_shapes import prompt_of
from gateway.request.schemas import RoutingFields, parse_json, routing_fields
from gateway.request.usage import Usage
from policies.types import Decision, RouteRequest

Routing = Literal["prefix", "load", "home"]
BodyKind = Literal["json", "form", "none"]
ErrorShape = Literal["openai", "anthropic"]
FORM_FIELDS = ("model", "stream", "user")
"""The fields of a multipart form that routing reads (the form itself goes on unchanged)."""


@dataclass(frozen=True, slots=True)
class Route:
    """What a routed endpoint is: what it does, where, its body, how it is routed."""

    kind: str
    """What the endpoint does (``chat``, ``embeddings``, ``tokenize``...); for a
    prompt-bearing route also how its prompt renders: ``chat``, ``completions``
    or ``responses`` (``gateway.request.prompt_shapes``)."""
    path: str
    """The path as the gateway matches it (``/v1/responses/{response_id}``)."""
    routing: Routing = "prefix"
    """``prefix``: by the prompt's cached blocks (by load when it has no prompt the
    gateway can render); ``load``: to the least loaded healthy replica of the model;
    ``home``: to the replica that holds the stored response the request names."""
    method: str = "POST"
    body: BodyKind = "json"
    """``json`` (an object), ``form`` (multipart, forwarded as bytes), ``none``."""
    errors: ErrorShape = "openai"
    """The shape of the errors the gateway itself answers with on this route: vLLM's
    Anthropic Messages API routes answer ``anthropic`` (``gateway.errors``)."""


@dataclass(slots=True)
class Outcome:
    """What happened to one request, for metrics and the request log."""

    replica_id: str = ""
    status: int = 0
    attempts: int = 0
    ttft: float | None = None
    usage: Usage | None = None
    output_tokens: int = 0
    head: bytes = b""
    """The start of a successful answer, once it came: a stream's first chunk, or a
    non-streaming answer's whole body (observers read it: ``gateway.request.response_homes``)."""
    error: str | None = None


@dataclass(slots=True)
class Exchange:
    client: Request
    """The HTTP request as the client sent it (its headers, body, disconnect)."""
    route: Route
    path_params: Mapping[str, str] = field(default_factory=dict)
    """The route path's parameters (``response_id``), as the route table matched them."""
    grant: Grant | None = None
    """What the caller's client key was admitted with (``gateway.auth.keys``); None
    without client keys."""
    started: float = field(default_factory=time.perf_counter)
    data: dict[str, Any] = field(default_factory=dict)
    """The parsed JSON body, as routed and forwarded (empty for other bodies): as the
    client sent it, but with client keys its ``cache_salt`` is the tenant's."""
    client_data: dict[str, Any] | None = None
    """The body as the client sent it, when ``data`` differs (``as_sent``)."""
    fields: RoutingFields = field(default_factory=RoutingFields)
    prompt: tuple[str, dict[str, Any]] | None = None
    """How the body's prompt renders for routing: (render kind, body); None without one."""
    model: str = ""
    request_id: str = ""
    session_key: str | None = None
    tenant: str | None = None
    """Who the linter groups the request with: the client's key or ``user``."""
    forward_body: bytes = b""
    forward_headers: dict[str, str] = field(default_factory=dict)
    request: RouteRequest | None = None
    decision: Decision | None = None
    lint_warnings: int | None = None
    """Warnings in this stable prefix when the linter has seen it before (its memo)."""
    before_answer: list[Callable[[], None]] = field(default_factory=list)
    """Work an observer put off until the request had left (``lifecycle.after_send``),
    done at the latest as the answer's headers are made (``response_headers``)."""
    outcome: Outcome = field(default_factory=Outcome)
    completed: bool = False
    """Its lifecycle said ``complete``: its observers (the recorder among them) have it."""

    @property
    def stream(self) -> bool:
        return self.fields.stream

    @property
    def target(self) -> str:
        """Where the replica gets the request: the client's path (as sent, percent-escapes
        kept) and query string."""
        scope = self.client.scope
        raw = scope.get("raw_path")
        path = raw.decode("latin-1") if raw else scope["path"]
        query = scope.get("query_string", b"").decode("latin-1")
        return f"{path}?{query}" if query else path

    @property
    def method(self) -> str:
        return self.route.method

    def parse(self, raw: bytes, is_secret: SecretTest) -> None:
        """Read what routing needs (``fields``, ``prompt``) and what goes on to the replica."""
        headers = self.client.headers
        if self.route.body == "json":
            self.data = parse_json(raw, headers)
            self.fields = routing_fields(self.data)
        elif self.route.body == "form":
            self.fields = routing_fields(
                form_fields(raw, headers.get("content-type", ""), FORM_FIELDS))
        else:
            self.fields = routing_fields(dict(self.client.query_params))
        self.request_id = headers.get("x-request-id") or uuid.uuid4().hex
        self.session_key = headers.get("x-session-id") or self.fields.user
        self.tenant = headers.get("authorization") or self.fields.user
        self.forward_body = raw
        self.forward_headers = forward_headers(headers, is_secret)
        self.forward_headers["x-request-id"] = self.request_id
        self._isolate(len(raw))
        if self.route.routing == "prefix" and self.route.body == "json":
            self.prompt = prompt_of(self.route.kind, self.data)

    def _isolate(self, body_bytes: int) -> None:
        """With client keys (``gateway.auth.keys``): the key's tenant is the tenant, its
        ``cache_salt`` goes into the body that is routed and forwarded, its session
        ids are its own and its token budget is charged (its key is never forwarded:
        ``gateway.request.forwarding``). Only the prefix-routed routes (chat, completions,
        responses: generation) take a ``cache_salt`` and count against
        ``tokens_per_minute``; the others' bodies go on as sent."""
        grant = self.grant
        if grant is None:
            return
        self.tenant = grant.tenant
        if self.session_key is not None:
            self.session_key = f"{grant.tenant}\x00{self.session_key}"
        if self.route.routing == "prefix" and self.route.body == "json":
            self.client_data, self.data = self.data, grant.isolate(self.data)
            self.forward_body = with_member(self.forward_body, self.client_data, "cache_salt",
                                            self.data["cache_salt"])
            grant.charge(estimate_tokens(self.data, body_bytes), self.tokens_used)

    @property
    def as_sent(self) -> dict[str, Any]:
        """The JSON body as the client sent it (what the prompt linter judges)."""
        return self.client_data if self.client_data is not None else self.data

    def tokens_used(self) -> int | None:
        """Prompt and completion tokens as the replica's ``usage`` reported them; 0 when
        no replica was tried (refused here), None when unknown."""
        usage = self.outcome.usage
        if usage is not None:
            return usage.prompt_tokens + usage.completion_tokens
        return 0 if self.outcome.attempts == 0 else None

    def set_model(self, model: str) -> None:
        """The model the request is routed for (filled in a JSON body that left it out)."""
        self.model = model
        if self.route.body == "json" and not self.fields.model:
            self.forward_body = with_model(self.forward_body, self.data, model)

    def predicted_cached(self, replica_id: str) -> int:
        """Prompt tokens the decision expected ``replica_id`` to hold."""
        if self.request is None or self.decision is None:
            return 0
        blocks = self.decision.matched_blocks.get(replica_id, 0)
        request = self.request
        # vLLM always recomputes the prompt's last token, so a fully cached
        # prompt hits one block less than it holds.
        reusable = (max(request.prompt_tokens - 1, 0) // request.block_size) * request.block_size
        return min(blocks * request.block_size, reusable)

    def uncached_tokens(self, replica_id: str) -> int:
        """Prompt tokens ``replica_id`` must prefill for this request, as the decision
        expected: the prompt less what it holds or has on its way (0 when not routed by
        prefix: the gateway did not read the prompt)."""
        request = self.request
        if request is None:
            return 0
        prompt = request.prompt_tokens or len(request.block_hashes) * request.block_size
        held = self.decision.matched_blocks.get(replica_id, 0) if self.decision else 0
        return max(0, prompt - held * request.block_size)

    def reason(self, replica_id: str) -> str:
        """Why ``replica_id`` answered: the policy's reason (``hit``, ``miss``,
        ``load-fallback``, ``session``, ...), or ``failover`` when the replica
        it chose failed before the first byte and a later one answered."""
        if self.decision is None:
            return "none"
        return self.decision.reason if replica_id == self.decision.replica_id else "failover"

    def settle(self) -> None:
        """Do the work observers put off (``before_answer``) that is not done yet."""
        while self.before_answer:
            self.before_answer.pop(0)()

    def response_headers(self, replica_id: str) -> dict[str, str]:
        """The gateway's own headers on the answer from ``replica_id``."""
        self.settle()
        headers = {"x-prefixgate-replica": replica_id, "x-request-id": self.request_id,
                   "x-prefixgate-matched-tokens": str(self.predicted_cached(replica_id))}
        if self.decision is not None:
            headers["x-prefixgate-reason"] = self.reason(replica_id)
            runner_up = next((r for r in self.decision.order if r != replica_id), None)
            if runner_up is not None:
                headers["x-prefixgate-runner-up"] = runner_up
                headers["x-prefixgate-runner-up-matched-tokens"] = str(
                    self.predicted_cached(runner_up))
        if self.lint_warnings is not None:
            headers["x-prefixgate-lint"] = str(self.lint_warnings)
        return headers


def with_model(body: bytes, data: dict[str, Any], model: str) -> bytes:
    """The JSON object ``body`` with ``model`` set (:func:`with_member`)."""
    return with_member(body, data, "model", model)


def with_member(body: bytes, data: dict[str, Any], name: str, value: str) -> bytes:
    """The JSON object ``body`` with ``name`` set, as its last key (so it wins over
    one the client sent), the rest as the client sent it: re-encoding would fail on a
    body nested deeper than orjson encodes (255 levels), which the replica may still take.
    A body in UTF-16 or UTF-32, which vLLM's reader takes too, is re-encoded as a whole
    (as UTF-8 JSON, with Python's writer: ``NaN`` stays ``NaN``)."""
    if not data:
        return orjson.dumps({name: value})
    if b"\x00" in body[:4]:  # UTF-16 or UTF-32: JSON in UTF-8 holds no raw NUL
        return json.dumps({**data, name: value}).encode()
    return body.rstrip()[:-1] + b"," + orjson.dumps(name) + b":" + orjson.dumps(value) + b"}"
