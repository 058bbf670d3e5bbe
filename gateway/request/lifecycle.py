"""What happens to a routed request, told to whoever listens.

The request path (``gateway.request.proxy``) says what happened and does not know who
listens; observers are registered once, at start-up (``create_app``)::

    decided(exchange)                 the request is parsed and its replicas chosen
    sent(exchange, replica_id)        an attempt left for that replica
    first_byte(exchange, replica_id)  that replica began a successful answer: a
                                      stream's first token, or the whole answer
    failed(exchange, replica_id)      that attempt ended before it: the replica
                                      failed or timed out, answered an error status,
                                      or the client left
    complete(exchange)                the exchange is over, however it ended

Each attempt is opened with ``attempt(exchange, replica_id)``, a context
manager that says ``sent`` on entry and ``failed`` on exit unless
``answered()`` said ``first_byte`` first: exactly one of the two follows
every ``sent``, whatever way the attempt ends (a pending prefix cannot
leak). Observers must not block: they run on the request's own task; one whose
work on ``decided`` can wait until the request has left defers it (``after_send``:
the live prompt linter).

The observers today: the routing learner (``gateway.request.decider.Decider``: the
policy's pending prefixes and what it learns at the first token) and the
recorder (``gateway.request.recorder.Recorder``: metrics and the access log).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from gateway.request.exchange import Exchange


class RequestObserver(Protocol):
    def on_decided(self, exchange: Exchange) -> None: ...

    def on_sent(self, exchange: Exchange, replica_id: str) -> None: ...

    def on_first_byte(self, exchange: Exchange, replica_id: str) -> None: ...

    def on_failed(self, exchange: Exchange, replica_id: str) -> None: ...

    def on_complete(self, exchange: Exchange) -> None: ...


class Attempt:
    """One attempt of an exchange on one replica (``Lifecycle.attempt``)."""

    __slots__ = ("_answered", "_exchange", "_lifecycle", "replica_id")

    def __init__(self, lifecycle: Lifecycle, exchange: Exchange, replica_id: str) -> None:
        self._lifecycle = lifecycle
        self._exchange = exchange
        self.replica_id = replica_id
        self._answered = False

    def answered(self) -> None:
        """The replica began a successful answer (said once)."""
        if not self._answered:
            self._answered = True
            for observer in self._lifecycle.observers:
                observer.on_first_byte(self._exchange, self.replica_id)

    def _end(self) -> None:
        if not self._answered:
            self._answered = True
            for observer in self._lifecycle.observers:
                observer.on_failed(self._exchange, self.replica_id)


class Lifecycle:
    def __init__(self, observers: Sequence[RequestObserver] = ()) -> None:
        self.observers: tuple[RequestObserver, ...] = tuple(observers)

    @contextlib.contextmanager
    def attempt(self, exchange: Exchange, replica_id: str) -> Iterator[Attempt]:
        attempt = Attempt(self, exchange, replica_id)
        for observer in self.observers:
            observer.on_sent(exchange, replica_id)
        try:
            yield attempt
        finally:
            attempt._end()

    def decided(self, exchange: Exchange) -> None:
        for observer in self.observers:
            observer.on_decided(exchange)

    def complete(self, exchange: Exchange) -> None:
        exchange.completed = True
        for observer in self.observers:
            observer.on_complete(exchange)


class Silent:
    """An observer that hears nothing it needs: a base for observers of one event."""

    def on_decided(self, exchange: Exchange) -> None:
        return None

    def on_sent(self, exchange: Exchange, replica_id: str) -> None:
        return None

    def on_first_byte(self, exchange: Exchange, replica_id: str) -> None:
        return None

    def on_failed(self, exchange: Exchange, replica_id: str) -> None:
        return None

    def on_complete(self, exchange: Exchange) -> None:
        return None


def after_send(take: Callable[[Exchange], None], exchange: Exchange) -> None:
    """For an observer's ``on_decided`` whose work can wait for the request to leave:
    ``take(exchange)`` on the serving loop's next turn, which the request's own task
    reaches only after writing the request (a pooled connection's write does not wait;
    a new connection's does, and the work then goes first), or when the answer's
    headers are made if that comes first (a replica that answers without the loop
    turning: in-process, a test's transport), so headers it sets go with the answer.
    Done once (``Exchange.settle``). Without a running loop (a test, a script), at once."""
    exchange.before_answer.append(functools.partial(take, exchange))
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        exchange.settle()
        return
    loop.call_soon(exchange.settle)
