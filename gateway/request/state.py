"""Everything one gateway instance holds, built at start-up (``gateway.server.start``).

No module globals: the running gateway holds one ``GatewayState``; the front
door and the routes are handed it when they are built. ``describe`` reduces an exchange's request to
what routing needs (its KV blocks, from the model's ``PromptHasher``) and
moves heavy prompt work off the event loop. What happens to the request
after its decision is told to the proxy's lifecycle observers
(``gateway.request.lifecycle``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from engine.pool.replicas import ReplicaPool
from gateway.config import Settings
from gateway.ops.metrics import GatewayMetrics
from gateway.prompt.hashers import HasherSet, TokenizerConfigError
from gateway.request.decider import Decider
from gateway.request.exchange import Exchange
from gateway.request.preparing import Preparing
from gateway.request.proxy import Proxy
from policies.types import RouteRequest


class WorkerView(Protocol):
    """One worker of several (``gateway.fleet.local.LocalSync``), as the routes see it."""

    def status(self) -> dict[str, object]: ...

    async def gather_metrics(self) -> bytes | None:
        """Every worker's ``/metrics``, merged; None when the others cannot be asked."""
        ...

    async def claim(self, prefix: int, replica_id: str, fallbacks: Sequence[str] = ()) -> str:
        """Where a prefix no replica holds or awaits goes: ``replica_id``, or the replica a
        sibling chose for it a moment ago (the first choice wins), or, past a sibling's new
        prefix this worker has not heard of yet, the first free of ``fallbacks``."""
        ...


class GatewayState:
    def __init__(self, settings: Settings, pool: ReplicaPool, decider: Decider, proxy: Proxy,
                 metrics: GatewayMetrics, hashers: HasherSet,
                 preparing: Preparing | None = None,
                 redis_status: Callable[[], dict[str, object]] | None = None,
                 workers: WorkerView | None = None) -> None:
        self.settings = settings
        self.pool = pool
        self.decider = decider
        self.proxy = proxy
        self.metrics = metrics
        self.started_at = time.time()
        self.hashers = hashers
        self.preparing = preparing or Preparing()
        """Requests between arrival and decision (``gateway.request.preparing``)."""
        self.redis_status = redis_status
        """The shared routing state's condition for ``/ready`` (``gateway.fleet.sync``),
        None without ``redis_url``."""
        self.workers = workers
        """This process's place among the gateway's workers (``--workers N``), or None."""

    def expected_models(self) -> list[str]:
        configured = [m.name for m in self.settings.models]
        configured += [r.model for r in self.settings.replicas if r.model]
        return list(dict.fromkeys(configured)) or self.pool.known_models()

    async def describe(self, exchange: Exchange) -> RouteRequest:
        """What routing needs to know of a request: its prompt's blocks.

        The decision sees every full block of the prompt up to the routing
        bounds (``gateway.prompt.bounds``), exactly as a full render and tokenize
        would give them: text shared with earlier requests can sit inside a
        piece never seen whole (a message that grows, a document with a new
        question appended), so no piece may be left out. Pieces tokenized
        before are memoized; what is left to tokenize goes to a worker thread
        when it is long (``PromptHasher.analyse``), so the loop never stalls
        on it; a request routing cannot analyse is routed by load.
        """
        model, (kind, body) = exchange.model, exchange.prompt or ("", {})
        session_key, request_id = exchange.session_key, exchange.request_id
        block_size = self.decider.block_size(model)
        output = exchange.fields.max_tokens
        if not self.decider.policy.uses_prefix or exchange.prompt is None:
            return RouteRequest(model, (), 0, block_size, session_key, request_id, output)
        hashers = self.hashers
        if not hashers.has_tokenizer(model) and not hashers.seen(model):
            # a model that appeared since start-up (a LoRA adapter loaded at run time):
            # its tokenizer is looked for now; this request routes on bytes meanwhile
            with contextlib.suppress(TokenizerConfigError):
                hashers.notice([model], self.pool.tokenizer_root)
        described = await hashers.get(model).analyse(model, body, kind, block_size,
                                                     session_key, request_id)
        return dataclasses.replace(described, output_tokens=output) if output else described
