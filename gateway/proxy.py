"""Send one routed request to a replica, failing over before the first byte.

For each replica of the decision's order (at most ``max_attempts``):
take a lease, send, and wait for the first byte of the answer — the status
line and, for a stream, the first chunk; for a non-streaming answer, the
whole body (it is small, and buffering it keeps failover possible until the
client has seen anything). A replica that cannot be reached or times out
before that point is reported to the pool (it leaves rotation) and the next
one is tried. After the first byte nothing is retried: a broken stream ends
with an error event (see ``streaming``).

An answer with an error status from a replica is passed through unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

from starlette.requests import Request
from starlette.responses import Response

from engine.backend import UpstreamResponse
from engine.errors import EngineError, ReplicaTimeout
from engine.pool import ReplicaPool

from .errors import UpstreamFailed, UpstreamTimeout
from .exchange import Exchange
from .metrics import GatewayMetrics
from .streaming import RelayStream, wait_disconnect
from .usage import StreamObserver, usage_from_json

log = logging.getLogger("prefixgate.proxy")

_PASS_RESPONSE_HEADERS = ("content-type",)


class Recorder(Protocol):
    """Told once when an exchange is over: answered, failed or abandoned
    (``gateway.recorder.Recorder``)."""

    def record(self, exchange: Exchange) -> None: ...


class Proxy:
    def __init__(self, pool: ReplicaPool, metrics: GatewayMetrics, max_attempts: int,
                 recorder: Recorder, clock: Callable[[], float] = time.perf_counter) -> None:
        self.pool = pool
        self.metrics = metrics
        self.max_attempts = max_attempts
        self.recorder = recorder
        self.clock = clock

    async def forward(self, exchange: Exchange) -> Response | RelayStream:
        """Send the exchange to the replicas of its decision, in order, until one answers."""
        assert exchange.decision is not None
        outcome = exchange.outcome
        last_error: EngineError | None = None
        path, body, headers = exchange.route.path, exchange.forward_body, exchange.forward_headers
        before_forward = self.clock() - exchange.started
        self.metrics.overhead_seconds.observe(before_forward)
        for replica_id in exchange.decision.order[: self.max_attempts]:
            outcome.attempts += 1
            stack = contextlib.ExitStack()
            stack.enter_context(self.pool.lease(replica_id))
            try:
                upstream = await self.pool.get(replica_id).backend.send(path, body, headers)
                if exchange.stream and upstream.status_code == 200:
                    first = await self._first_chunk(upstream)
                    received = self.clock()
                    outcome.ttft = received - exchange.started

                    def first_sent(received: float = received) -> None:
                        self.metrics.added_ttft_seconds.observe(
                            before_forward + self.clock() - received)

                    return self._relay(upstream, first, replica_id, exchange, stack,
                                       self._headers(upstream, exchange, replica_id), first_sent)
                payload = await self._read_all(exchange.client, upstream)
                if payload is None:
                    stack.close()
                    outcome.replica_id, outcome.status = replica_id, 499
                    outcome.error = "client disconnected"
                    self.recorder.record(exchange)
                    return Response(status_code=499)
            except EngineError as exc:
                stack.close()
                last_error = exc
                self.pool.report_failure(replica_id, exc.detail)
                self.metrics.failovers.labels(replica_id).inc()
                log.warning("failover from %s: %s", replica_id, exc.detail)
                continue
            except BaseException:
                stack.close()
                raise
            stack.close()
            outcome.replica_id = replica_id
            outcome.status = upstream.status_code
            if upstream.status_code == 200:
                outcome.usage = usage_from_json(payload)
                outcome.output_tokens = outcome.usage.completion_tokens if outcome.usage else 0
            self.recorder.record(exchange)
            return Response(payload, status_code=upstream.status_code,
                            headers=self._headers(upstream, exchange, replica_id))
        message = last_error.detail if last_error else "no replica could be tried"
        if isinstance(last_error, ReplicaTimeout):
            raise UpstreamTimeout(f"replica timed out: {message}")
        raise UpstreamFailed(f"all {outcome.attempts} replica(s) tried failed; last: {message}")

    async def _first_chunk(self, upstream: UpstreamResponse) -> bytes:
        try:
            async for chunk in upstream.chunks:
                return chunk
        except BaseException:
            await upstream.close()
            raise
        await upstream.close()
        return b""

    async def _read_all(self, request: Request, upstream: UpstreamResponse) -> bytes | None:
        """The whole body, abandoned (and the upstream request aborted) on disconnect."""
        reader = asyncio.ensure_future(upstream.read())
        watcher = asyncio.ensure_future(wait_disconnect(request.receive))
        try:
            done, _ = await asyncio.wait({reader, watcher}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                return reader.result()
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
            return None
        finally:
            watcher.cancel()
            if not reader.done():
                reader.cancel()

    def _relay(self, upstream: UpstreamResponse, first: bytes, replica_id: str,
               exchange: Exchange, stack: contextlib.ExitStack,
               headers: dict[str, str], first_sent: Callable[[], None]) -> RelayStream:
        observer = StreamObserver()
        outcome = exchange.outcome
        outcome.replica_id = replica_id
        outcome.status = upstream.status_code

        async def finish(error: BaseException | None) -> None:
            try:
                await upstream.close()
            finally:
                stack.close()
                outcome.usage = observer.usage()
                outcome.output_tokens = observer.output_tokens(outcome.usage)
                if isinstance(error, EngineError):
                    outcome.error = error.detail
                    self.metrics.stream_errors.labels(replica_id).inc()
                    self.pool.report_failure(replica_id, error.detail)
                elif error is not None:
                    outcome.error = "client disconnected"
                self.recorder.record(exchange)

        return RelayStream(first, upstream.chunks, upstream.status_code, headers,
                           observer.feed, finish, first_sent)

    @staticmethod
    def _headers(upstream: UpstreamResponse, exchange: Exchange,
                 replica_id: str) -> dict[str, str]:
        out = {k: v for k, v in upstream.headers.items() if k.lower() in _PASS_RESPONSE_HEADERS}
        out.update(exchange.response_headers(replica_id))
        return out
