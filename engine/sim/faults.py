"""Faults a sim replica can be told to have on heavy requests: hang, or crash.

A real engine can be taken down by one request: vLLM given ``"n": 1000000000``,
a huge ``max_tokens`` or thousands of tools may stop answering, or die, while
it holds that request. The simulator answers such requests at once, so to
test what the gateway does about a query of death the sim is told which
requests are its queries of death::

    prefixgate sim --hang-on 'n>8,max_tokens>100000,tools>64' [--hang-scope request]
    prefixgate sim --hang-on 'messages>500' --hang-scope replica
    prefixgate sim --crash-on 'n>1000'
    prefixgate sim --cut-on 'n>8'

A rule is ``FIELD>LIMIT``; a generation request (``POST /v1/chat/completions``,
``/v1/completions``, ``/v1/responses``) whose JSON body has a top-level
``FIELD`` whose size is over ``LIMIT`` matches: a number's size is its value
(``true`` is 1), a list's, object's or string's its length; a missing field
or a body that is not a JSON object never matches (the routes answer those).
Several rules, comma-separated, match when any one does.

``--hang-on`` with ``--hang-scope``:

    request   (default) the matching request is never answered (its connection
              stays open until the client leaves); everything else is served:
              a stuck sequence.
    replica   the matching request and everything after it, ``/health``
              included, are never answered, and streams already running stop
              mid-way: a wedged engine. Connections are still accepted, as
              they are by a hung vLLM.

``--crash-on``: the process exits at once (status 70) when a matching
request arrives, before answering anything: an engine that dies holding the
request (the gateway sees its connection reset).

``--cut-on``: a matching request gets its status line and half of its body (a
stream: its first event and half of the second), then its connection is closed;
everything else is served: a replica's bug that cuts one answer short while it
goes on serving (vLLM 0.32 does this to ``GET /v1/responses/{id}?stream=true``),
or a replica that dies in the middle of writing an event.

:class:`FaultInjector` is an ASGI middleware around the sim's app, added by
the CLI only when a rule is given; without one the app is unchanged.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("engine.sim.faults")

GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/responses"})
CRASH_STATUS = 70
"""Exit status of ``--crash-on`` (EX_SOFTWARE)."""

Scope_ = Literal["request", "replica"]


@dataclass(frozen=True, slots=True)
class Rule:
    """``field>limit``: the body's ``field`` is larger than ``limit``."""

    field: str
    limit: float

    def matches(self, body: Mapping[str, Any]) -> bool:
        size = _size(body.get(self.field))
        return size is not None and size > self.limit

    def __str__(self) -> str:
        return f"{self.field}>{self.limit:g}"


def _size(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (list, dict, str)):
        return float(len(value))
    return None


def parse_rules(text: str) -> tuple[Rule, ...]:
    """``FIELD>LIMIT[,FIELD>LIMIT...]``; ``ValueError`` naming the bad rule."""
    rules = []
    for item in (part.strip() for part in text.split(",")):
        field, sep, limit = item.partition(">")
        try:
            if not sep or not field.strip():
                raise ValueError
            rules.append(Rule(field.strip(), float(limit)))
        except ValueError:
            raise ValueError(f"bad fault rule {item!r}: expected FIELD>NUMBER, "
                             "e.g. n>8 or max_tokens>100000") from None
    return tuple(rules)


@dataclass(frozen=True, slots=True)
class FaultPlan:
    hang_on: tuple[Rule, ...] = ()
    hang_scope: Scope_ = "request"
    crash_on: tuple[Rule, ...] = ()
    cut_on: tuple[Rule, ...] = ()

    @property
    def active(self) -> bool:
        return bool(self.hang_on or self.crash_on or self.cut_on)


def _rules_argument(text: str) -> tuple[Rule, ...]:
    try:
        return parse_rules(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_fault_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("faults (see engine.sim.faults)")
    group.add_argument("--hang-on", type=_rules_argument, default=(), metavar="RULES",
                       help="never answer a generation request matching any rule, "
                            "e.g. 'n>8,max_tokens>100000,tools>64'")
    group.add_argument("--hang-scope", choices=("request", "replica"), default="request",
                       help="what hangs: that request only, or the whole replica from then on")
    group.add_argument("--crash-on", type=_rules_argument, default=(), metavar="RULES",
                       help="exit at once (status 70) when a generation request matches")
    group.add_argument("--cut-on", type=_rules_argument, default=(), metavar="RULES",
                       help="cut a matching generation request's answer short (its connection "
                            "closed mid-body) and go on serving")


def fault_plan(args: argparse.Namespace) -> FaultPlan:
    return FaultPlan(args.hang_on, args.hang_scope, args.crash_on, args.cut_on)


def with_faults(app: ASGIApp, plan: FaultPlan) -> ASGIApp:
    """``app`` with the plan's faults, or ``app`` itself when the plan has none."""
    return FaultInjector(app, plan) if plan.active else app


class FaultInjector:
    """The ASGI middleware of a fault plan (module docstring)."""

    def __init__(self, app: ASGIApp, plan: FaultPlan,
                 crash: Callable[[int], None] = os._exit) -> None:
        self.app = app
        self.plan = plan
        self.crash = crash
        self.wedged = asyncio.Event()
        """Set once a request wedged the replica (scope ``replica``)."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.wedged.is_set():
            await _forever()
        if scope["method"] != "POST" or scope["path"] not in GENERATION_PATHS:
            await self.app(scope, receive, self._stalling(send))
            return
        messages = await _read_body(receive)
        body = _json_object(b"".join(m.get("body", b"") for m in messages))
        if body is not None:
            self._maybe_crash(body)
            if any(rule.matches(body) for rule in self.plan.hang_on):
                await self._hang(scope, receive)
                return
            if any(rule.matches(body) for rule in self.plan.cut_on):
                await self.app(scope, _replay(messages, receive), _cutting(send))
                return
        await self.app(scope, _replay(messages, receive), self._stalling(send))

    def _maybe_crash(self, body: Mapping[str, Any]) -> None:
        rule = next((r for r in self.plan.crash_on if r.matches(body)), None)
        if rule is not None:
            log.error("fault: crashing on a request matching %s", rule)
            logging.shutdown()
            self.crash(CRASH_STATUS)

    async def _hang(self, scope: Scope, receive: Receive) -> None:
        log.warning("fault: hanging (%s) on %s", self.plan.hang_scope, scope["path"])
        if self.plan.hang_scope == "replica":
            self.wedged.set()
            await _forever()
        while (await receive())["type"] != "http.disconnect":
            pass  # the client left: the request ends without an answer

    def _stalling(self, send: Send) -> Send:
        """``send`` that stops for good once the replica is wedged (running streams)."""

        async def stalling(message: Message) -> None:
            if self.wedged.is_set():
                await _forever()
            await send(message)

        return stalling


class AnswerCut(Exception):
    """Raised into the server under a ``--cut-on`` answer: it closes the connection."""


def _cutting(send: Send) -> Send:
    """``send`` that passes the status line and a stream's first event and half of its
    second (half of a whole body), then raises, which makes the server close the
    connection mid-body: as a replica dies in the middle of writing an event."""
    started = False

    async def cutting(message: Message) -> None:
        nonlocal started
        if message["type"] != "http.response.body":
            await send(message)
            return
        if message.get("more_body", False) and not started:
            started = True
            await send(message)
            return
        body = message.get("body", b"")
        if body:  # the next event (or a whole body): half of it
            await send({"type": "http.response.body", "body": body[:len(body) // 2],
                        "more_body": True})
        log.warning("fault: cutting an answer short")
        raise AnswerCut("fault: answer cut short")

    return cutting


async def _forever() -> None:
    await asyncio.Event().wait()


async def _read_body(receive: Receive) -> list[Message]:
    messages = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages


def _replay(messages: list[Message], receive: Receive) -> Receive:
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


def _json_object(raw: bytes) -> dict[str, Any] | None:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None
