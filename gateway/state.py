"""Everything one gateway instance holds, wired by ``create_app``.

No module globals: the app owns one ``GatewayState``; routes reach it through
the closure that built them. ``describe`` reduces an exchange's request to
what routing needs (its KV blocks, from the model's ``PromptHasher``) and
moves heavy prompt work off the event loop; ``observe_lint`` hands the
request to the prompt linter once it has left. Recording a finished
exchange is ``gateway.recorder``'s.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from engine.pool import ReplicaPool
from policies.types import RouteRequest

from .config import Settings
from .exchange import Exchange
from .hashers import HasherSet
from .lint.service import LintService
from .metrics import GatewayMetrics
from .proxy import Proxy
from .routing import Router

T = TypeVar("T")

log = logging.getLogger("prefixgate.state")

async def after_request_leaves(work: Callable[[], Awaitable[T]]) -> T:
    """``work()``, begun one turn of the event loop late.

    Sending a request body, aiohttp on Python 3.11 queues a task of its own
    that writes it (3.12+ starts it eagerly). Work queued by the handler
    before it sends would run first and hold the request back; started from
    here it runs after the write.
    """
    await asyncio.sleep(0)
    return await work()


class GatewayState:
    def __init__(self, settings: Settings, pool: ReplicaPool, router: Router, proxy: Proxy,
                 metrics: GatewayMetrics, hashers: HasherSet,
                 lint: LintService | None = None) -> None:
        self.settings = settings
        self.pool = pool
        self.router = router
        self.proxy = proxy
        self.metrics = metrics
        self.started_at = time.time()
        self.hashers = hashers
        self.lint = lint
        self.redis_status: Callable[[], dict[str, object]] | None = None
        """The shared routing state's condition for ``/ready`` (``gateway.fleet_sync``),
        None without ``redis_url``."""

    def expected_models(self) -> list[str]:
        configured = [m.name for m in self.settings.models]
        configured += [r.model for r in self.settings.replicas if r.model]
        return list(dict.fromkeys(configured)) or self.pool.known_models()

    async def describe(self, exchange: Exchange) -> RouteRequest:
        """What routing needs to know of a request: its prompt's blocks.

        The decision sees every full block of the prompt up to the routing
        bounds (``gateway.bounds``), exactly as a full render and tokenize
        would give them: text shared with earlier requests can sit inside a
        piece never seen whole (a message that grows, a document with a new
        question appended), so no piece may be left out. Pieces tokenized
        before are memoized; what is left to tokenize goes to a worker thread
        when it is long (``PromptHasher.analyse``), so the loop never stalls
        on it; a request routing cannot analyse is routed by load.
        """
        model, (kind, body) = exchange.model, exchange.prompt or ("", {})
        session_key, request_id = exchange.session_key, exchange.request_id
        block_size = self.router.block_size(model)
        if not self.router.policy.uses_prefix or exchange.prompt is None:
            return RouteRequest(model, (), 0, block_size, session_key, request_id)
        return await self.hashers.get(model).analyse(model, body, kind, block_size,
                                                     session_key, request_id)

    def observe_lint(self, exchange: Exchange) -> None:
        """Lint a chat request's stable prefix once the request has left (never awaited)."""
        if self.lint is None or exchange.route.kind != "chat" or exchange.prompt is None:
            return
        lint = self.lint
        try:
            exchange.lint_warnings = lint.known_warnings(exchange.model, exchange.as_sent,
                                                         exchange.tenant)
        except Exception as exc:  # noqa: BLE001 - the linter observes; it never fails a request
            log.warning("prompt lint could not read a request (%s)", type(exc).__name__)
            return
        exchange.lint = asyncio.ensure_future(after_request_leaves(
            lambda: lint.check(exchange.model, exchange.as_sent, exchange.tenant)))
