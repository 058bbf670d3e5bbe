"""The prompt linter on live traffic in a thread (``lint.worker: thread``, the default): a
lifecycle observer of decided chat requests. ``lint.worker: process`` lints in a
process of its own instead (``gateway.server.lint_process``).

When a chat request with a prompt is decided (``gateway.request.lifecycle``),
and has left for its replica (``after_send``: the next turn of the loop), the
linter says what it already knows of that stable prefix (its memo:
``LintService.known_warnings``, the ``x-prefixgate-lint`` header on the answer: a
hash and a lookup). The real lint runs off the serving loop: the request is put
on a bounded queue that one worker thread drains (``LintService.check_now``,
which takes its own locks); when the queue is full the request is not linted
and ``prefixgate_lint_dropped_total`` counts it. The queue is a deque the worker
looks at every 200 ms while it has work, linting what came in the meantime in
one go and letting the loop in after each millisecond of it
(backing off to a third of a second while it stays empty): a
``queue.Queue`` notified the worker on every put, from the serving loop
(with ``Preparing``'s event, 7% of the gateway's samples under streaming
traffic). Why 200 ms and a millisecond: a lint of a known prefix costs some
14 us in a loop of them, and 75 us when it runs alone after the thread slept
(its code and data are no longer in the CPU's caches); looking every 20 ms
and giving the interpreter back after each lint, the thread's lints cost
130-151 us a request under ~90 streams, as now 101-102 us in three runs
(docs/benchmarks/overhead.md, stop 60). Linting on the loop, even after the
request had left, put its CPU time (tens of milliseconds for a long new
prompt) in front of other requests'
first bytes. A worker thread alone did not free the loop either: while both
want the interpreter they take turns every switch interval, so in a burst
the linter took half the gateway's time before each request left
(docs/benchmarks/bursts.md). So the worker lints only while no request is being
prepared (``gateway.request.preparing``: between arrival and decision); a
burst queues its lints and they run once its requests have left, and under
load that never lets up the queue fills and drops, counted. Its CPU is bounded
too (``lint.cpu_share``, ``gateway.lint.budget``): beyond its share of a core,
requests are skipped, counted the same way. The linter only
observes: anything it cannot read is logged and the request goes on.

It lives here, in the composition layer, because the request path never
imports the linter and the linter never imports the request path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from gateway.lint.budget import CpuBudget
from gateway.lint.service import LintService
from gateway.lint.structure import TextField, prefix_fields
from gateway.ops.metrics import GatewayMetrics
from gateway.request.exchange import Exchange
from gateway.request.lifecycle import Silent, after_send
from gateway.request.preparing import Preparing

log = logging.getLogger("prefixgate.lint")

QUEUE_REQUESTS = 1024
"""Requests waiting to be linted, at most (each holds a reference to its parsed body)."""

IDLE_POLL_SECONDS = 0.5
"""How often a worker waiting for the gateway to be idle looks whether it is closing."""

QUEUE_POLL_SECONDS = 0.2
"""How often the worker looks for requests to lint when it has just had some: what came in
the meantime is linted in one go. A new prefix's warnings reach the header this much
later at most; a lint run in a batch costs a fraction of one run alone."""

YIELD_SECONDS = 0.001
"""Thread CPU time the worker lints for before it lets the loop have the interpreter (if
it waits): a known prefix's lint takes some 14 us, so not after each one."""

QUEUE_POLL_MAX_SECONDS = 0.32
"""How often at most when it has had none for a while: each empty look doubles the wait up
to this, so an idle gateway wakes its linter 3 times a second, not 50 (each wake-up takes
the interpreter from the serving loop); the first request after a pause is linted within
this, its header says what the linter already knew at once."""

_Item = tuple[str, Mapping[str, Any], str | None, list[TextField]]


LINTED_ROUTES = frozenset({"chat", "responses", "messages", "chat_batch", "invocations"})
"""Routes whose prompt renders as a chat request (``gateway.request.prompt_shapes``): a
batch of chats is judged by its first conversation, SageMaker's invocations when they
hold a chat."""


def is_linted(exchange: Exchange) -> bool:
    """Whether the linter judges a decided request: one whose prompt renders as chat."""
    prompt = exchange.prompt
    return prompt is not None and prompt[0] == "chat" and exchange.route.kind in LINTED_ROUTES


def linted_body(exchange: Exchange) -> Mapping[str, Any]:
    """What the linter judges of a request it lints (``is_linted``): a chat request's body
    as the client sent it; a Responses or Anthropic Messages API request as the chat
    request routing renders it as (an agent's instructions are its system prompt), up to
    its first tool call."""
    if exchange.route.kind == "chat" or exchange.prompt is None:
        return exchange.as_sent
    chat = exchange.prompt[1]
    messages = chat.get("messages") or []
    # An agent's turn is judged on what it says before its first tool call, as each turn
    # repeats it (routing reads the tool calls too: gateway.request.prompt_shapes).
    calls = next((index for index, message in enumerate(messages)
                  if message.get("role") == "tool" or message.get("tool_calls")), None)
    if calls:
        chat = {**chat, "messages": messages[:calls]}
    return {"model": exchange.model, **chat}


class LiveLint(Silent):
    def __init__(self, lint: LintService, metrics: GatewayMetrics, preparing: Preparing,
                 capacity: int = QUEUE_REQUESTS, budget: CpuBudget | None = None) -> None:
        self.lint = lint
        self.budget = budget or CpuBudget(0)
        self.metrics = metrics
        self.preparing = preparing
        self.capacity = capacity
        self._closing = threading.Event()
        self._queue: deque[_Item] = deque()  # appended on the loop, taken by the worker
        self._thread: threading.Thread | None = None
        self._sleep: Callable[[float], None] = time.sleep

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="prefixgate-lint", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop the worker once what is queued is linted."""
        if self._thread is None:
            return
        self._closing.set()  # what is queued is linted now, requests being prepared or not
        self._thread.join(timeout=10)
        self._thread = None

    def queued(self) -> int:
        """Requests waiting to be linted now (``prefixgate_lint_queue_requests``)."""
        return len(self._queue)

    def on_decided(self, exchange: Exchange) -> None:
        if is_linted(exchange):
            after_send(self.take, exchange)

    def take(self, exchange: Exchange) -> None:
        """The header's lookup, and the request queued for the worker (on the loop)."""
        model, body, tenant = exchange.model, linted_body(exchange), exchange.tenant
        try:
            fields = prefix_fields(body)  # walked once: the thread lints the same ones
            exchange.lint_warnings = self.lint.known_warnings(model, body, tenant, fields)
        except Exception as exc:  # noqa: BLE001 - the linter observes; it never fails a request
            log.warning("prompt lint could not read a request (%s)", type(exc).__name__)
            return
        if len(self._queue) >= self.capacity:
            self.metrics.lint_dropped.inc()
        else:
            self._queue.append((model, body, tenant, fields))

    def _run(self) -> None:
        wait = QUEUE_POLL_SECONDS
        yielded = time.thread_time()
        while True:
            try:
                model, body, tenant, fields = self._queue.popleft()
            except IndexError:
                if self._closing.is_set():
                    return
                self._sleep(wait)
                yielded = time.thread_time()
                wait = min(wait * 2, QUEUE_POLL_MAX_SECONDS)
                continue
            wait = QUEUE_POLL_SECONDS
            while not self._closing.is_set() and not self.preparing.wait_idle(IDLE_POLL_SECONDS):
                pass  # requests are being prepared: they come first
            if not self.budget.allows():  # its share of a core is spent (lint.cpu_share)
                self.metrics.lint_dropped.inc()
                continue
            started = time.thread_time()
            try:
                self.lint.check_now(model, body, tenant, fields)
            except Exception:
                log.exception("prompt lint failed on a request (it was routed without it)")
            finally:
                done = time.thread_time()
                self.budget.charge(done - started)
            if self._queue and done - yielded >= YIELD_SECONDS:
                self._sleep(0)  # the interpreter to the loop between lints, if it waits
                yielded = done
