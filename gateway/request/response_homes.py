"""Which replica holds each stored Responses API response.

vLLM keeps a ``/v1/responses`` answer in the memory of the server that made
it (with ``VLLM_ENABLE_RESPONSES_API_STORE=1``): a follow-up naming it in
``previous_response_id``, and ``GET /v1/responses/{id}`` or ``POST
/v1/responses/{id}/cancel``, work only on that server. So whenever the
gateway relays a successful responses answer it remembers its id and the
replica (a bounded LRU: the oldest ids are forgotten first), and sends every
later request naming the id there (``gateway.request.dispatch``).

The id is read from the answer without parsing a stream: a non-streamed
answer is one JSON object whose ``id`` it is; a stream's first event,
``response.created``, carries the response object, whose ``id`` is the first
in the event. An id the gateway never saw (it restarted, or another gateway
instance relayed it) is looked for on the replicas (``Dispatcher``).

With client keys a stored response belongs to the tenant whose request made
it: another tenant naming its id (to read, cancel or continue it) gets vLLM's
own 404, and an id the gateway does not remember is not looked for on the
replicas, since nothing would say whose it is (after a restart, such ids
answer 404 until they are made again).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import orjson

from gateway.request.exchange import Exchange
from gateway.request.lifecycle import Silent
from policies.lru import LRU

CAPACITY = 100_000
"""Response ids remembered (about 150 bytes each)."""

_FIRST_ID = re.compile(rb'"id"\s*:\s*"([^"\\]{1,200})"')


@dataclass(frozen=True, slots=True)
class Home:
    replica_id: str
    model: str
    owner: str | None = None
    """The tenant whose request made it (with client keys); only that tenant may name it."""


def owner_of(exchange: Exchange) -> str | None:
    """The caller's tenant when client keys are configured, else None (no owners)."""
    grant = exchange.grant
    return grant.tenant if grant is not None else None


def named_response(exchange: Exchange) -> str | None:
    """The stored response a request names: the path's id, or ``previous_response_id``."""
    if exchange.route.kind != "responses":
        return None
    named = exchange.path_params.get("response_id")
    if named is None:
        named = exchange.data.get("previous_response_id")
    return named if isinstance(named, str) and named else None


def answered_id(head: bytes) -> str | None:
    """The response id in a responses answer: its JSON body, or a stream's first event."""
    if head.startswith(b"{"):
        try:
            answer = orjson.loads(head)
        except orjson.JSONDecodeError:
            return None
        found = answer.get("id") if isinstance(answer, dict) else None
        return found if isinstance(found, str) and found else None
    match = _FIRST_ID.search(head)
    return match.group(1).decode() if match else None


class ResponseHomes(Silent):
    def __init__(self, capacity: int = CAPACITY) -> None:
        self._homes: LRU[str, Home] = LRU(capacity)

    def get(self, response_id: str) -> Home | None:
        return self._homes.get(response_id)

    def put(self, response_id: str, home: Home) -> None:
        self._homes.put(response_id, home)

    # -- a lifecycle observer (gateway.request.lifecycle) ---------------------

    def on_first_byte(self, exchange: Exchange, replica_id: str) -> None:
        """Note where a successful responses answer is being made."""
        if exchange.route.kind != "responses":
            return
        response_id = answered_id(exchange.outcome.head)
        if response_id is not None:
            self.put(response_id, Home(replica_id, exchange.model, owner_of(exchange)))

    def __len__(self) -> int:
        return len(self._homes)
