"""Does the gateway render a model's prompts to the token ids its replicas do?

Routing hashes the token ids the gateway renders. When a replica renders
others (it runs vLLM with ``--chat-template``, another tokenizer, another
vLLM version), nothing fails, but the hashes never meet the replica's cache:
``precise`` matches none of its KV events, ``prefix`` predicts hits the
replica does not have, and the hit rate drops with no error anywhere.

So each time a replica turns healthy, for each model it serves that the
gateway has a real tokenizer for, the gateway renders a few fixed chats
(:data:`PROBES`: its own text, never a client's) and asks the replica's
``/tokenize`` for the same. The result, per model and replica
(:class:`RenderCheck`): ``match``; ``differs`` (which probe, from which
token), logged as a warning that says what to set; or ``unchecked`` (the
replica has no ``/tokenize`` or refused it, or did not answer). It is on
``/ready`` (``tokenizers``) and ``prefixgate_render_check``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import orjson

from engine.backends.base import JSON, Backend
from engine.errors import EngineError
from engine.tokenizer import RenderError
from gateway.prompt.render import PromptHasher

if TYPE_CHECKING:
    from engine.pool.replicas import ReplicaPool
    from gateway.prompt.hashers import HasherSet

log = logging.getLogger("prefixgate.render_check")

CHECK_SECONDS = 10.0
"""The longest one probe may take, request and answer."""

_TOOL = {"type": "function", "function": {
    "name": "lookup_order", "description": "Find an order by its number.",
    "parameters": {"type": "object", "properties": {"number": {"type": "string"}},
                   "required": ["number"]}}}
_CALL = {"id": "call_0", "type": "function",
         "function": {"name": "lookup_order", "arguments": "{\"number\": \"A-1\"}"}}

PROBES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("system and user", {"messages": [
        {"role": "system", "content": "You are a support assistant. Be brief."},
        {"role": "user", "content": "Where is my parcel?"}]}),
    ("several turns", {"messages": [
        {"role": "system", "content": "Answer in one sentence."},
        {"role": "user", "content": "Name a colour."},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "  Another one, please?\n"}]}),
    ("text parts", {"messages": [
        {"role": "user", "content": [{"type": "text", "text": "First part."},
                                     {"type": "text", "text": " Second part. "}]}]}),
    ("developer message", {"messages": [
        {"role": "developer", "content": "Use British spelling."},
        {"role": "user", "content": "Describe a colour."}]}),
    ("tools and a call", {"tools": [_TOOL], "messages": [
        {"role": "user", "content": "Find order A-1."},
        {"role": "assistant", "content": None, "tool_calls": [_CALL]},
        {"role": "tool", "tool_call_id": "call_0", "content": "{\"status\": \"shipped\"}"}]}),
)
"""Chats of the shapes that render differently when the replica's template or vLLM's
reading of the messages differs: turns, content parts, roles, tools."""

Result = Literal["match", "differs", "unchecked"]


@dataclass(frozen=True, slots=True)
class RenderCheck:
    result: Result
    detail: str
    """In words: probes compared, the first difference, or why it was not checked."""

    def as_json(self) -> dict[str, str]:
        return {"result": self.result, "detail": self.detail}


async def check_replica(model: str, hasher: PromptHasher, backend: Backend) -> RenderCheck:
    """Compare the gateway's token ids with the replica's on :data:`PROBES`."""
    compared = 0
    for name, chat in PROBES:
        try:
            ours = hasher.token_ids(model, {"model": model, **chat}, "chat")
        except (RenderError, ValueError):
            continue  # a shape this template does not take: nothing to compare
        try:
            status, theirs = await asyncio.wait_for(_tokenize(backend, model, chat),
                                                    CHECK_SECONDS)
        except (EngineError, OSError, TimeoutError, ValueError) as exc:
            return RenderCheck("unchecked", f"/tokenize did not answer ({type(exc).__name__})")
        if status in (401, 403, 404, 405, 501):
            return RenderCheck("unchecked", f"the replica refused /tokenize ({status})")
        if status != 200 or theirs is None:
            continue  # the replica refuses this shape (400): nothing to compare
        compared += 1
        if ours != theirs:
            at = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b),
                      min(len(ours), len(theirs)))
            return RenderCheck("differs", f"probe '{name}': token {at} differs "
                               f"({len(ours)} tokens here, {len(theirs)} on the replica)")
    if not compared:
        return RenderCheck("unchecked", "no probe could be compared")
    return RenderCheck("match", f"{compared} probes, identical token ids")


async def _tokenize(backend: Backend, model: str,
                    chat: Mapping[str, Any]) -> tuple[int, list[int] | None]:
    body = orjson.dumps({"model": model, "add_generation_prompt": True, **chat})
    response = await backend.send("/tokenize", body, {"content-type": JSON})
    raw = await response.read()
    if response.status_code != 200:
        return response.status_code, None
    try:
        tokens = orjson.loads(raw).get("tokens")
    except (orjson.JSONDecodeError, AttributeError):
        return response.status_code, None
    ok = isinstance(tokens, list) and all(type(t) is int for t in tokens)
    return response.status_code, tokens if ok else None


def advice(model: str, replica_id: str, check: RenderCheck, source: str | None) -> str:
    """The warning for a replica that renders differently: what to look at."""
    return (f"model {model}: replica {replica_id} renders prompts to other token ids than the "
            f"gateway ({check.detail}), so routing cannot match its prefix cache. If it runs "
            f"vLLM with --chat-template, give the gateway the same value (--chat-template, "
            f"models[].chat_template); else check the tokenizer (here from {source}) and the "
            f"replica's vLLM version")


class RenderChecker:
    """Checks each (model, replica) when the replica turns healthy (it may have restarted
    with another template), one check at a time per pair; results go to the hashers."""

    def __init__(self, hashers: HasherSet, pool: ReplicaPool) -> None:
        self.hashers = hashers
        self.pool = pool
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}

    def start(self) -> None:
        for replica in self.pool:
            if replica.healthy:
                self.replica_healthy(replica.id, True)
        self.pool.add_listener(self.replica_healthy)

    def replica_healthy(self, replica_id: str, healthy: bool) -> None:
        if not healthy:
            return
        for model in list(self.pool.get(replica_id).models):
            key = (model, replica_id)
            if key not in self._running:
                task = asyncio.ensure_future(self._check(model, replica_id))
                self._running[key] = task
                task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        for key, running in list(self._running.items()):
            if running is task:
                del self._running[key]

    async def _check(self, model: str, replica_id: str) -> None:
        from gateway.prompt.hashers import TokenizerConfigError
        try:
            await self.hashers.discover([model], self.pool.tokenizer_root)
        except TokenizerConfigError:
            return  # said at start-up
        if not self.hashers.has_tokenizer(model):
            return  # the byte renderer predicts no token ids to compare
        try:
            backend = self.pool.get(replica_id).backend
        except KeyError:
            return  # removed meanwhile
        check = await check_replica(model, self.hashers.get(model), backend)
        self.hashers.record_check(model, replica_id, check)
        if check.result == "differs":
            choice = self.hashers.choice(model)
            log.warning("%s", advice(model, replica_id, check,
                                     choice.note if choice is not None else None))
        else:
            log.info("model %s: replica %s render check: %s (%s)", model, replica_id,
                     check.result, check.detail)

    async def aclose(self) -> None:
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
