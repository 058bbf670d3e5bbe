"""The prompt linter on live traffic: a lifecycle observer of decided chat requests.

When a chat request with a prompt is decided (``gateway.request.lifecycle``),
the linter says at once what it already knows of that stable prefix (its
memo: ``LintService.known_warnings``, the ``x-prefixgate-lint`` header), and
lints it for real once the request has left: the work is begun one turn of
the event loop late, so it never holds the request back. The linter only
observes: anything it cannot read is logged and the request goes on.

It lives here, in the composition layer, because the request path never
imports the linter and the linter never imports the request path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from gateway.lint.service import LintService
from gateway.request.exchange import Exchange
from gateway.request.lifecycle import Silent

T = TypeVar("T")

log = logging.getLogger("prefixgate.lint")


async def after_request_leaves(work: Callable[[], Awaitable[T]]) -> T:
    """``work()``, begun one turn of the event loop late.

    Sending a request body, aiohttp on Python 3.11 queues a task of its own
    that writes it (3.12+ starts it eagerly). Work queued by the handler
    before it sends would run first and hold the request back; started from
    here it runs after the write.
    """
    await asyncio.sleep(0)
    return await work()


class LiveLint(Silent):
    def __init__(self, lint: LintService) -> None:
        self.lint = lint
        self._running: set[asyncio.Future[int | None]] = set()
        """Checks in progress (a reference each, so none is collected mid-way)."""

    def on_decided(self, exchange: Exchange) -> None:
        if exchange.route.kind != "chat" or exchange.prompt is None:
            return
        lint = self.lint
        try:
            exchange.lint_warnings = lint.known_warnings(exchange.model, exchange.as_sent,
                                                         exchange.tenant)
        except Exception as exc:  # noqa: BLE001 - the linter observes; it never fails a request
            log.warning("prompt lint could not read a request (%s)", type(exc).__name__)
            return
        check = asyncio.ensure_future(after_request_leaves(
            lambda: lint.check(exchange.model, exchange.as_sent, exchange.tenant)))
        self._running.add(check)
        check.add_done_callback(self._running.discard)
