"""Send one routed request to a replica, failing over before the first byte.

For each replica of the decision's order (at most ``max_attempts``):
take a lease, send, and wait for the first byte of the answer — the status
line and, for a stream, the first chunk; for a non-streaming answer, the
whole body (it is small, and buffering it keeps failover possible until the
client has seen anything). A replica that fails before that point is
reported to the pool (its breaker opens), and the next one is tried only
when the failure cannot be this request's doing: the replica could not be
reached (the request never arrived), or it made progress after the request
arrived (another request's first byte, or its token counters moved:
``ReplicaPool.worked_after``) — a replica killed or stopped under load. A
replica that stopped with no sign of life since this request arrived may
have been stopped *by* it (a request that hangs or crashes the engine):
retried, it would take down every replica it is sent to, so it is answered
with an error at once and counted (``prefixgate_requests_not_retried_total``).
A request that got no first byte in time is never retried either: if the
replica served others meanwhile the request is what is stuck, and the
replica stays in rotation; if it did not, the replica leaves rotation only
when other requests are stuck there too (one stuck request on an idle
replica is the request's; a wedged engine stops them all), and the health
probes judge the rest (``_after_failure``'s table).
Fallbacks that left rotation since the decision are skipped. After the
first byte nothing is retried: a broken stream ends with an error event
(see ``streaming``).

Deadlines: a stream's status line and first chunk within
``timeouts.first_byte`` — a request queued on a replica that is working
through its queue (``ReplicaPool.working_through_a_queue``: progress in the
last ``first_byte`` seconds, others waiting) is not lost, and waits another
``first_byte``, as it would on vLLM directly, up to ``timeouts.response``;
any status line within ``timeouts.response`` (the backend's; a
non-streaming answer's status line comes with the whole answer); body
chunks after the first within ``timeouts.idle``. While the request waits, a
:class:`~gateway.request.interrupts.RequestGuard` watches the client (a disconnect
abandons the attempt and so aborts the upstream request, even before its
status line), the replica (a breaker opened for failing sends the request to
the next replica) and the drain (its end answers 503). The answer's time to
first chunk goes to the pool, which compares it with the replica's peers.

An answer with an error status from a replica is passed through unchanged.

Each attempt holds a pool lease (in-flight count, and the request's uncached
prompt tokens as the replica's unconfirmed prefill until its first byte) and
is told to the lifecycle's observers (``gateway.request.lifecycle``): sent, then its
first byte or its failure; the end of the exchange completes it. The proxy
does not know who listens.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from starlette.responses import Response

from engine.backends.base import Timeouts, UpstreamResponse
from engine.errors import (
    EngineError,
    ReplicaStreamBroken,
    ReplicaTimeout,
    ReplicaUnavailable,
    ReplicaUnreachable,
)
from engine.pool.replicas import Lease, ReplicaPool
from gateway.errors import UpstreamFailed, UpstreamTimeout
from gateway.ops.metrics import GatewayMetrics
from gateway.request.drain import Drain
from gateway.request.exchange import Exchange
from gateway.request.interrupts import ClientGone, RequestGuard
from gateway.request.lifecycle import Attempt, Lifecycle
from gateway.request.streaming import RelayEnd, RelayStream, StreamCut
from gateway.request.usage import StreamObserver, usage_from_json

log = logging.getLogger("prefixgate.proxy")

_PASS_RESPONSE_HEADERS = ("content-type",)


@dataclass(frozen=True, slots=True)
class _Answer:
    upstream: UpstreamResponse
    body: bytes
    """A stream's first chunk, or a non-streaming answer's whole body."""
    ttft: float | None
    """A stream's seconds from sending to its first chunk."""
    streams: bool


class _FirstByteWatch:
    """Expires ``deadline`` after ``first_byte`` seconds, unless the replica is working
    through a queue then: it looks again ``first_byte`` seconds later."""

    __slots__ = ("_deadline", "_first_byte", "_handle", "_queued")

    def __init__(self, deadline: asyncio.Timeout, first_byte: float,
                 queued: Callable[[], bool]) -> None:
        self._deadline = deadline
        self._first_byte = first_byte
        self._queued = queued
        self._handle = asyncio.get_running_loop().call_later(first_byte, self._check)

    def _check(self) -> None:
        loop = asyncio.get_running_loop()
        if self._queued():
            self._handle = loop.call_later(self._first_byte, self._check)
        else:
            self._deadline.reschedule(loop.time())

    def cancel(self) -> None:
        self._handle.cancel()


def _is_event_stream(headers: Mapping[str, str]) -> bool:
    """Whether an answer's body is server-sent events (relayed whole events at a time);
    both backends name headers in lower case."""
    return headers.get("content-type", "").startswith("text/event-stream")


def _held_failure(replica_id: str, exc: EngineError,
                  worked: bool) -> UpstreamFailed | UpstreamTimeout:
    if worked:  # a timeout while the replica served others
        message = (f"replica {replica_id} served other requests but did not start this one "
                   f"({exc.detail}); it is not retried on another replica, where it would "
                   "most likely wait the same")
    else:
        message = (f"replica {replica_id} failed while holding this request ({exc.detail}), "
                   "with no progress since it arrived; it is not retried on another "
                   "replica, where a request that stops a replica would stop that one too")
    return UpstreamTimeout(message) if isinstance(exc, ReplicaTimeout) else UpstreamFailed(message)


class Proxy:
    def __init__(self, pool: ReplicaPool, metrics: GatewayMetrics, max_attempts: int,
                 lifecycle: Lifecycle, clock: Callable[[], float] = time.perf_counter,
                 timeouts: Timeouts | None = None, drain: Drain | None = None) -> None:
        self.pool = pool
        self.metrics = metrics
        self.max_attempts = max_attempts
        self.lifecycle = lifecycle
        self.clock = clock
        self.first_byte = (timeouts or Timeouts()).first_byte
        self.drain = drain or Drain(0)
        self._guards: set[RequestGuard] = set()
        pool.add_listener(self._on_health)

    async def forward(self, exchange: Exchange) -> Response | RelayStream:
        """Send the exchange to the replicas of its decision, in order, until one answers."""
        assert exchange.decision is not None
        before_forward = self.clock() - exchange.started
        self.metrics.overhead_seconds.observe(before_forward)
        guard = RequestGuard(exchange.client.receive)
        self._guards.add(guard)
        try:
            with self.drain.tracking(guard):
                return await self._try_replicas(exchange, guard, before_forward)
        except ClientGone:
            outcome = exchange.outcome
            outcome.status, outcome.error = 499, "client disconnected"
            self.lifecycle.complete(exchange)
            return Response(status_code=499)
        finally:
            guard.close()
            self._guards.discard(guard)

    async def _try_replicas(self, exchange: Exchange, guard: RequestGuard,
                            before_forward: float) -> Response | RelayStream:
        assert exchange.decision is not None
        outcome = exchange.outcome
        last_error: EngineError | None = None
        for replica_id in exchange.decision.order[: self.max_attempts]:
            if outcome.attempts and not self.pool.admits(replica_id):
                continue  # out of rotation since the decision
            outcome.attempts += 1
            outcome.replica_id = replica_id
            stack = contextlib.ExitStack()
            lease = stack.enter_context(
                self.pool.lease(replica_id, exchange.uncached_tokens(replica_id)))
            attempt = stack.enter_context(self.lifecycle.attempt(exchange, replica_id))
            try:
                with guard.waiting_on(replica_id):
                    answer = await self._attempt(exchange, replica_id)
            except EngineError as exc:
                stack.close()
                last_error = exc
                if not self._after_failure(replica_id, lease, exc):
                    raise _held_failure(replica_id, exc, self.pool.worked_after(lease)) from None
                continue
            except BaseException:
                stack.close()
                raise
            return self._answer(exchange, lease, attempt, answer, stack, before_forward, guard)
        message = last_error.detail if last_error else "no replica could be tried"
        if isinstance(last_error, ReplicaTimeout):
            raise UpstreamTimeout(f"replica timed out: {message}")
        raise UpstreamFailed(f"all {outcome.attempts} replica(s) tried failed; last: {message}")

    def _after_failure(self, replica_id: str, lease: Lease, exc: EngineError) -> bool:
        """Whose failure it was, told to the pool; whether to try the next replica.

        ======================  ===================================  ===================
        failure                 the replica made progress after the  it did not
                                request arrived
        ======================  ===================================  ===================
        unreachable             (never arrived) breaker opens, next
        no first byte in time   it serves others, not this one: the  breaker opens only
                                request's doing, answered (504)      if others are stuck
                                                                     there too; answered
        dropped, cut short,     a bystander of a dying replica, or   answered (502)
        left rotation           of a bug for this request: next
        ======================  ===================================  ===================

        A dropped connection or a body cut short opens the breaker only if the replica
        then fails a health check (``ReplicaPool.report_broken``): a replica that cuts
        one request's answer short and serves the rest stays in rotation.
        """
        if isinstance(exc, ReplicaUnreachable):
            self.pool.report_failure(replica_id, exc.detail)
            self.metrics.failovers.labels(replica_id).inc()
            log.warning("failover from %s: %s", replica_id, exc.detail)
            return True
        worked = self.pool.worked_after(lease)
        if isinstance(exc, ReplicaTimeout):
            if not worked and self.pool.pending_prefill(replica_id)[0] > 0:
                self.pool.report_failure(replica_id, exc.detail)  # stuck with others: wedged
        else:
            self._broken(replica_id, exc)
            if worked:
                self.metrics.failovers.labels(replica_id).inc()
                log.warning("failover from %s: %s", replica_id, exc.detail)
                return True
        self.metrics.not_retried.labels(replica_id).inc()
        log.warning("not retried elsewhere: %s failed holding the request (%s)",
                    replica_id, exc.detail)
        return False

    def _broken(self, replica_id: str, exc: EngineError) -> None:
        """A request failed holding the replica: a dropped connection or a body cut short
        opens the breaker only if the replica then fails a health check (it may be this
        request's doing); a replica that stopped answering mid-way opens it now."""
        if isinstance(exc, (ReplicaUnavailable, ReplicaStreamBroken)):
            self.pool.report_broken(replica_id, exc.detail)
        else:
            self.pool.report_failure(replica_id, exc.detail)

    async def _attempt(self, exchange: Exchange, replica_id: str) -> _Answer:
        """Send to one replica and wait for the first byte: a stream's status line and
        first chunk (within ``first_byte``), or a non-streaming answer's whole body."""
        backend = self.pool.get(replica_id).backend
        sent = self.clock()
        if not exchange.stream:
            upstream = await backend.send(exchange.target, exchange.forward_body,
                                          exchange.forward_headers, exchange.method)
            return _Answer(upstream, await upstream.read(), None, False)
        try:
            async with asyncio.timeout(None) as deadline:
                watch = _FirstByteWatch(deadline, self.first_byte, functools.partial(
                    self.pool.working_through_a_queue, replica_id, self.first_byte))
                try:
                    upstream = await backend.send(exchange.target, exchange.forward_body,
                                                  exchange.forward_headers, exchange.method)
                    if upstream.status_code != 200:
                        return _Answer(upstream, await upstream.read(), None, False)
                    first = await self._first_chunk(upstream)
                finally:
                    watch.cancel()
        except TimeoutError:
            raise ReplicaTimeout(replica_id, "no first token within the first-byte timeout "
                                 f"({self.first_byte:g}s), and the replica made no progress "
                                 "through a queue meanwhile") from None
        return _Answer(upstream, first, self.clock() - sent, True)

    def _answer(self, exchange: Exchange, lease: Lease, attempt: Attempt, answer: _Answer,
                stack: contextlib.ExitStack, before_forward: float,
                guard: RequestGuard) -> Response | RelayStream:
        """What the client gets from the replica that answered (which closes its breaker)."""
        replica_id = attempt.replica_id
        self.pool.report_first_byte(lease, answer.ttft,
                                    prefilled=answer.upstream.status_code == 200)
        upstream, outcome = answer.upstream, exchange.outcome
        if upstream.status_code == 200:
            outcome.head = answer.body
            attempt.answered()
        headers = self._headers(upstream, exchange, replica_id)
        if answer.streams:
            received = self.clock()
            outcome.ttft = received - exchange.started
            return self._relay(upstream, answer.body, replica_id, exchange, stack, headers,
                               before_forward - received, guard.hand_over())
        stack.close()
        outcome.status = upstream.status_code
        if upstream.status_code == 200:
            outcome.usage = usage_from_json(answer.body)
            outcome.output_tokens = outcome.usage.completion_tokens if outcome.usage else 0
        self.lifecycle.complete(exchange)
        return Response(answer.body, status_code=upstream.status_code, headers=headers)

    def _on_health(self, replica_id: str, healthy: bool) -> None:
        """A replica whose breaker opened because it failed: requests waiting on it go on."""
        if healthy or not self.pool.tripped(replica_id):
            return
        for guard in list(self._guards):
            if guard.replica_id == replica_id:
                guard.interrupt(ReplicaUnavailable(
                    replica_id, "left rotation while the request waited for it"))

    async def _first_chunk(self, upstream: UpstreamResponse) -> bytes:
        try:
            async for chunk in upstream.chunks:
                return chunk
        except BaseException:
            await upstream.close()
            raise
        await upstream.close()
        return b""

    def _relay(self, upstream: UpstreamResponse, first: bytes, replica_id: str,
               exchange: Exchange, stack: contextlib.ExitStack,
               headers: dict[str, str], added_before: float,
               disconnected: asyncio.Future[None]) -> RelayStream:
        """``added_before``: the gateway's own time before the first chunk goes out, less
        the clock when it came in (what the added-TTFT metric adds the send time to)."""
        observer = StreamObserver()
        outcome = exchange.outcome
        outcome.replica_id = replica_id
        outcome.status = upstream.status_code

        async def finish(end: RelayEnd) -> None:
            error = end.error
            if end.first_sent_at is not None:
                self.metrics.added_ttft_seconds.observe(added_before + end.first_sent_at)
            try:
                await upstream.close()
            finally:
                stack.close()
                outcome.usage = observer.usage()
                outcome.output_tokens = observer.output_tokens(outcome.usage)
                if isinstance(error, EngineError):
                    outcome.error = error.detail
                    self.metrics.stream_errors.labels(replica_id).inc()
                    self._broken(replica_id, error)
                elif isinstance(error, StreamCut):
                    outcome.error = "ended at the end of the drain period"
                elif error is not None:
                    outcome.error = "client disconnected"
                self.lifecycle.complete(exchange)

        return RelayStream(upstream.chunks, upstream.status_code, headers, finish,
                           first=first, observer=observer, drain=self.drain,
                           disconnected=disconnected, pour=upstream.pour,
                           anthropic=exchange.route.errors == "anthropic",
                           events=_is_event_stream(upstream.headers))

    @staticmethod
    def _headers(upstream: UpstreamResponse, exchange: Exchange,
                 replica_id: str) -> dict[str, str]:
        out = {k: v for k, v in upstream.headers.items() if k.lower() in _PASS_RESPONSE_HEADERS}
        out.update(exchange.response_headers(replica_id))
        return out
