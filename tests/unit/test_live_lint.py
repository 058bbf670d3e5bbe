"""The live prompt linter lints off the serving loop, and drops what it cannot keep up with."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from starlette.requests import Request

from gateway.lint.budget import CpuBudget
from gateway.request.exchange import Exchange, Route
from gateway.request.preparing import Preparing
from gateway.server.live_lint import LiveLint


class SlowLint:
    """A LintService that blocks in check_now until told to go on, and records the thread."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.checked: list[tuple[str, str | None]] = []
        self.threads: set[str] = set()

    def known_warnings(self, model: str, body: Any, tenant: str | None,
                       fields: Any = None) -> int | None:
        return 2 if self.checked else None

    def check_now(self, model: str, body: Any, tenant: str | None, fields: Any = None) -> int:
        self.threads.add(threading.current_thread().name)
        self.go.wait(10)
        self.checked.append((model, tenant))
        return 2


def exchange(tenant: str, kind: str = "chat") -> Exchange:
    """A decided request as the linter is handed it (a chat one has a prompt)."""
    return Exchange(client=Request({"type": "http"}), route=Route(kind=kind, path="/v1/" + kind),
                    prompt=("chat", {}) if kind == "chat" else None, model="m",
                    data={"messages": []}, tenant=tenant)


def test_the_linter_works_in_its_own_thread_and_drops_when_its_queue_is_full() -> None:
    lint = SlowLint()
    dropped = Counter("dropped", "", registry=CollectorRegistry())
    live = LiveLint(lint, SimpleNamespace(lint_dropped=dropped), Preparing(), capacity=2)  # type: ignore[arg-type]
    live.start()
    try:
        decided = [exchange(f"t{i}") for i in range(5)]
        live.on_decided(decided[0])
        started = threading.Event()
        while not lint.threads:     # the worker took the first and is stuck on it
            started.wait(0.01)
        for each in decided[1:]:
            live.on_decided(each)   # returns at once
        # one in the worker, two queued, two dropped (counted)
        assert dropped._value.get() == 2
        assert all(each.lint_warnings is None for each in decided)
        lint.go.set()
    finally:
        live.close()
    assert [tenant for _, tenant in lint.checked] == ["t0", "t1", "t2"]
    assert lint.threads == {"prefixgate-lint"}
    later = exchange("t9")
    live.on_decided(later)       # what the last lint found, for the header
    assert later.lint_warnings == 2


async def test_the_linter_looks_a_request_up_only_once_it_has_left() -> None:
    """On the serving loop the linter's part (its prefix walked, the header's lookup)
    waits for the loop's next turn: the request's task writes it to its replica first,
    and its answer, which carries the header, cannot be read before that turn."""
    done: list[str] = []

    class Recording(SlowLint):
        def known_warnings(self, model: str, body: Any, tenant: str | None,
                           fields: Any = None) -> int | None:
            done.append("looked up")
            return 1

    dropped = Counter("dropped", "", registry=CollectorRegistry())
    live = LiveLint(Recording(), SimpleNamespace(lint_dropped=dropped), Preparing())  # type: ignore[arg-type]
    request = exchange("t")
    live.on_decided(request)
    done.append("sent")          # what the request's task does next, before it waits
    assert request.lint_warnings is None and live.queued() == 0
    await asyncio.sleep(0)       # it waits for the answer: the loop turns
    assert done == ["sent", "looked up"]
    assert request.lint_warnings == 1 and live.queued() == 1


async def test_an_answer_that_comes_before_the_loop_turns_still_carries_the_header() -> None:
    """A replica that answers without the loop turning (in-process, a test's transport):
    the lookup is done as the answer's headers are made, and only once."""
    lint = SlowLint()
    lint.checked.append(("m", "before"))  # known: its lookup says 2
    dropped = Counter("dropped", "", registry=CollectorRegistry())
    live = LiveLint(lint, SimpleNamespace(lint_dropped=dropped), Preparing())  # type: ignore[arg-type]
    request = exchange("t")
    live.on_decided(request)
    assert request.response_headers("r0")["x-prefixgate-lint"] == "2"
    await asyncio.sleep(0)       # the turn it was put off to: nothing done twice
    assert live.queued() == 1


def test_beyond_its_share_of_a_core_requests_go_unlinted_and_counted() -> None:
    lint = SlowLint()
    lint.go.set()
    dropped = Counter("dropped", "", registry=CollectorRegistry())
    live = LiveLint(lint, SimpleNamespace(lint_dropped=dropped), Preparing(),  # type: ignore[arg-type]
                    budget=CpuBudget(1e-9))  # a lint's CPU is more than it ever gets back
    live.start()
    for i in range(20):
        live.on_decided(exchange(f"t{i}"))
    live.close()
    # the first few (its burst, each charged at most half of it), then none
    assert 1 <= len(lint.checked) <= 3 and len(lint.checked) + dropped._value.get() == 20


def test_only_chat_requests_with_a_prompt_are_linted() -> None:
    lint = SlowLint()
    lint.go.set()
    live = LiveLint(lint, SimpleNamespace(lint_dropped=None), Preparing())  # type: ignore[arg-type]
    live.start()
    live.on_decided(exchange("t0", kind="embeddings"))
    live.close()
    assert lint.checked == []


def test_the_linter_waits_while_requests_are_being_prepared() -> None:
    """A burst's requests are read, rendered and decided before any of them is linted:
    the linter's thread would take the interpreter from them half of the time."""
    lint = SlowLint()
    lint.go.set()
    preparing = Preparing()
    live = LiveLint(lint, SimpleNamespace(lint_dropped=None), preparing)  # type: ignore[arg-type]
    live.start()
    try:
        with preparing.request():
            with preparing.request():
                live.on_decided(exchange("t0"))
            live.on_decided(exchange("t1"))
            assert not threading.Event().wait(0.3) and lint.checked == []
        assert preparing.wait_idle(0) and preparing.count == 0
        for _ in range(500):
            if len(lint.checked) == 2:
                break
            threading.Event().wait(0.01)
        assert [tenant for _, tenant in lint.checked] == ["t0", "t1"]
    finally:
        live.close()


def test_closing_lints_what_is_queued_even_while_requests_are_being_prepared() -> None:
    lint = SlowLint()
    lint.go.set()
    preparing = Preparing()
    live = LiveLint(lint, SimpleNamespace(lint_dropped=None), preparing)  # type: ignore[arg-type]
    live.start()
    with preparing.request():   # a request that never finishes preparing
        live.on_decided(exchange("t0"))
        live.close()
    assert [tenant for _, tenant in lint.checked] == ["t0"]


def test_an_idle_linter_looks_at_its_queue_less_and_less_often() -> None:
    """An idle gateway's linter thread backs off to QUEUE_POLL_MAX_SECONDS between looks
    (each look takes the interpreter from the serving loop), and looks often again once
    it has work."""
    from gateway.server import live_lint

    lint = SlowLint()
    lint.go.set()
    metrics = SimpleNamespace(lint_dropped=Counter("d", "d", registry=CollectorRegistry()))
    live = LiveLint(lint, metrics, Preparing())  # type: ignore[arg-type]
    waits: list[float] = []

    def sleep(seconds: float) -> None:  # the worker's clock, driven by the test
        waits.append(seconds)
        if len(waits) == 8:
            live.on_decided(exchange("t"))      # work arrives after a long idle spell
        if len(waits) == 12:
            live._closing.set()

    live._sleep = sleep
    live._run()
    first, most = live_lint.QUEUE_POLL_SECONDS, live_lint.QUEUE_POLL_MAX_SECONDS
    backoff = [min(first * 2 ** n, most) for n in range(8)]
    assert backoff[0] < backoff[1] and backoff[-1] == most  # it does back off, to the most
    assert waits[:8] == backoff
    assert waits[8] == first                   # it had work: it looks often again
    assert lint.checked == [("m", "t")]


def test_cheap_lints_run_as_a_batch_and_a_long_one_lets_the_loop_in_after_it() -> None:
    """The worker gives the interpreter to the loop (``sleep(0)``) once it has linted for
    YIELD_SECONDS of its CPU, not after each lint: a known prefix's lint is some 14 us,
    and each hand-over left the next one to run with cold caches. A lint longer than
    that still lets the loop in right after it."""
    from gateway.server import live_lint

    class Burning(SlowLint):
        def __init__(self, seconds: float) -> None:
            super().__init__()
            self.go.set()
            self.seconds = seconds

        def check_now(self, model: str, body: Any, tenant: str | None,
                      fields: Any = None) -> int:
            end = time.thread_time() + self.seconds
            while time.thread_time() < end:
                pass
            return super().check_now(model, body, tenant, fields)

    def yields(each: float, lints: int) -> int:
        lint = Burning(each)
        live = LiveLint(lint, SimpleNamespace(lint_dropped=None), Preparing())  # type: ignore[arg-type]
        for i in range(lints):
            live.take(exchange(f"t{i}"))
        given: list[float] = []

        def sleep(seconds: float) -> None:
            given.append(seconds)
            if seconds:          # the queue is empty: the worker waits for more
                live._closing.set()

        live._sleep = sleep
        live._run()
        assert len(lint.checked) == lints
        return given.count(0)

    step = live_lint.YIELD_SECONDS
    assert 1 <= yields(step / 10, 20) <= 3     # 20 lints, 2 ms in all: once or twice
    assert yields(step * 2, 3) == 2            # after the first and the second, not the last
