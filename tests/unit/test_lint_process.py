"""The live prompt linter in a process of its own (``lint.worker: process``, the default):
a real child process, the parent's loop, what comes back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
from collections.abc import AsyncIterator, Callable
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter
from starlette.requests import Request

from engine.tokenizer import ByteRenderer
from gateway.config import ModelSettings
from gateway.lint.service import LintService, tenant_id
from gateway.lint.structure import lint_view, prefix_fields
from gateway.prompt.hashers import HasherSet
from gateway.request.exchange import Exchange, Route
from gateway.server.lint_process import LintProcess

POLICY = ("You are the support assistant of Fabrikam Bikes. Orders ship within two working "
          "days. Returns are free for 30 days. Keep answers short and friendly. ") * 3
STAMPED = POLICY + "Current time: 2026-12-06 07:41:09 UTC."


def chat(system: str, user: str = "Where is my order?", **extra: Any) -> dict[str, Any]:
    return {"messages": [{"role": "system", "content": system},
                         {"role": "user", "content": user}], **extra}


def decided(body: dict[str, Any], tenant: str = "sk-app") -> Exchange:
    return Exchange(client=Request({"type": "http"}), route=Route(kind="chat", path="/v1/chat"),
                    prompt=("chat", body), model="qwen", data=body, tenant=tenant)


def counters() -> SimpleNamespace:
    registry = CollectorRegistry()
    return SimpleNamespace(lint_dropped=Counter("dropped", "", registry=registry),
                           lint_process_restarts=Counter("restarts", "", registry=registry))


def count(counter: Counter) -> float:
    return counter._value.get()


async def until(what: Callable[[], bool], describe: str, seconds: float = 90) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not what():
        assert asyncio.get_running_loop().time() < deadline, f"never: {describe}"
        await asyncio.sleep(0.02)


async def decide(live: LintProcess, exchange: Exchange) -> None:
    """What the lifecycle says once a request is decided, and the loop's next turn: the
    request has left, and the linter has looked its prefix up (``after_send``)."""
    live.on_decided(exchange)
    await asyncio.sleep(0)


def findings(service: LintService) -> dict[str, int]:
    return {stat.kind: stat.count for stat in service.top_findings(50)}


@contextlib.asynccontextmanager
async def running(service: LintService, metrics: SimpleNamespace | None = None,
                  **options: float) -> AsyncIterator[LintProcess]:
    """A started linter process, closed on the way out (what was queued linted first)."""
    live = LintProcess(service, metrics or counters(), **options)  # type: ignore[arg-type]
    live.start()
    try:
        yield live
    finally:
        await live.aclose()


@pytest.fixture()
def service(qwen_dir: str) -> LintService:
    models = [ModelSettings(name="qwen", tokenizer=qwen_dir)]
    return LintService(HasherSet(models), models)


async def test_requests_are_linted_in_the_linters_process_and_what_it_found_comes_back(
        service: LintService) -> None:
    metrics = counters()
    async with running(service, metrics) as live:
        first = decided(chat(STAMPED))
        await decide(live, first)
        assert first.lint_warnings is None  # not linted yet: the header says nothing
        await until(lambda: findings(service).get("timestamp") == 1, "the first lint back")
        again, clean = decided(chat(STAMPED, "And my refund?")), decided(chat(POLICY))
        await decide(live, again)
        await decide(live, clean)
        assert again.lint_warnings == 1  # what the child found, known here at once
        assert clean.lint_warnings is None
        await until(lambda: live.queued() == 0, "both linted")
        later = decided(chat(POLICY, "Can I return a helmet?"))
        await decide(live, later)
        assert later.lint_warnings == 0
        # The learning is the child's: this process's table is empty, the child's is not.
        assert live.pid is not None and live.pid != os.getpid()
        assert service.groups.snapshot() == []
        groups = await live.group_summaries(20, False)
        assert groups is not None and sum(g["requests"] for g in groups) == 4  # "later" too
        assert "sk-app" not in str(groups)
    assert live._proc is not None and live._proc.poll() is not None  # the child is gone
    assert count(metrics.lint_dropped) == 0


async def test_a_full_queue_drops_and_counts_and_closing_lints_what_was_sent(
        service: LintService) -> None:
    metrics = counters()
    async with running(service, metrics, capacity=2) as live:  # closing lints the two
        for i in range(5):  # a turn of the loop apart, not 20 ms: none has gone by the third
            await decide(live, decided(chat(STAMPED, f"question {i}")))
        assert live.queued() == 2 and count(metrics.lint_dropped) == 3
    assert findings(service) == {"timestamp": 2}


async def test_beyond_its_share_of_a_core_the_linters_process_skips_and_counts(
        service: LintService) -> None:
    metrics = counters()
    async with running(service, metrics, cpu_share=1e-9) as live:  # a few lints, no more
        for i in range(20):
            await decide(live, decided(chat(STAMPED, f"question {i}")))
    linted = findings(service)["timestamp"]
    assert 1 <= linted <= 3 and linted + count(metrics.lint_dropped) == 20


async def test_a_linter_process_that_dies_is_replaced_and_what_it_held_is_counted(
        service: LintService) -> None:
    metrics = counters()
    async with running(service, metrics, restart_seconds=0.05) as live:
        await decide(live, decided(chat(STAMPED)))
        await until(lambda: live.queued() == 0, "the child up and answering")
        first_pid = live.pid
        assert first_pid is not None
        for i in range(3):
            await decide(live, decided(chat(STAMPED, f"question {i}")))
        os.kill(first_pid, signal.SIGKILL)
        await until(lambda: count(metrics.lint_process_restarts) == 1, "the death noticed")
        # what it answered before dying was read; the rest is counted as not linted
        assert findings(service)["timestamp"] - 1 + count(metrics.lint_dropped) == 3
        await until(lambda: live.pid is not None, "a new child")
        assert live.pid != first_pid
        linted = findings(service)["timestamp"]
        after = decided(chat(STAMPED, "after the restart"))
        await decide(live, after)
        assert after.lint_warnings is None  # forgotten with the child that told it
        await until(lambda: findings(service)["timestamp"] == linted + 1, "a lint by the new one")
        again = decided(chat(STAMPED, "and again"))
        await decide(live, again)
        assert again.lint_warnings == 1


async def test_a_linter_process_that_stops_answering_is_replaced(service: LintService) -> None:
    """A child stuck on a request (here: stopped) is ended and replaced; the serving
    side never waits for it."""
    metrics = counters()
    async with running(service, metrics, restart_seconds=0.05) as live:
        await decide(live, decided(chat(STAMPED)))
        await until(lambda: live.queued() == 0, "the child up and answering")
        live.stall_seconds = 1.0  # started (its tokenizer loaded): now a short patience
        stuck = live.pid
        assert stuck is not None
        os.kill(stuck, signal.SIGSTOP)
        await decide(live, decided(chat(STAMPED, "never answered")))
        await until(lambda: count(metrics.lint_process_restarts) == 1, "the stuck child ended")
        assert count(metrics.lint_dropped) == 1
        await until(lambda: live.pid is not None and live.pid != stuck, "a new child")
        live.stall_seconds = 30.0  # the new one loads its tokenizer first
        linted = findings(service)["timestamp"]
        await decide(live, decided(chat(STAMPED, "to the new one")))
        await until(lambda: findings(service)["timestamp"] == linted + 1, "a lint by the new one")


async def test_the_header_follows_a_prefix_whose_warnings_change(service: LintService) -> None:
    """The child reports a prefix's warnings only when they differ from what it last
    reported: the header still says what the last lint of that prefix found."""
    salted = {"cache_salt": "9f3b2c7d1e8a4f60b5c2"}  # looks unique per request: a warning
    async with running(service) as live:
        seen = []
        for extra in (salted, {}, {}, salted, {}):
            request = decided(chat(POLICY, **extra))
            await decide(live, request)
            seen.append(request.lint_warnings)
            await until(lambda: live.queued() == 0, "linted")
        last = decided(chat(POLICY))
        await decide(live, last)
        seen.append(last.lint_warnings)
    assert seen == [None, 1, 0, 0, 1, 0]


def test_the_view_sent_to_the_linters_process_finds_what_the_whole_body_does(
        qwen_dir: str) -> None:
    """``lint_view`` keeps what ``examine`` reads: two services (same sample key, same
    clock), one given whole bodies, one the views, find the same warnings and drifts over
    a varied stream (tools in and out of order, salts, template kwargs, system and
    developer messages, history, request ids, a timestamp that comes in: drifts)."""
    models = [ModelSettings(name="qwen", tokenizer=qwen_dir)]
    whole, viewed = (LintService(HasherSet(models), models, clock=lambda: 1796543000.0)
                     for _ in range(2))
    viewed._sample_key = whole._sample_key
    rng = random.Random(7)
    kinds: set[str] = set()
    drifts = 0
    tools = [{"type": "function", "function": {"name": name, "description": "Look it up.",
                                               "parameters": {"type": "object"}}}
             for name in ("orders", "refunds", "stock")]
    for i in range(300):
        system = POLICY if i < 150 else POLICY.replace(
            "Orders ship", f"Now: 2026-12-06 07:{i % 60:02d}:0{i % 10}. Orders ship", 1)
        if rng.random() < 0.05:
            system += f" Request {rng.getrandbits(64):016x}."
        messages: Any = [{"role": "system", "content": system}]
        if rng.random() < 0.1:
            messages.append({"role": "developer", "content": "Answer in English."})
        if rng.random() < 0.3:
            messages += [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hi!"}]
        messages.append({"role": "user", "content": f"question {i}"})
        if i % 50 == 49:
            messages = "not a list"
        body: dict[str, Any] = {"messages": messages}
        if rng.random() < 0.5:
            body["tools"] = rng.sample(tools, k=3) if rng.random() < 0.2 else tools
        if rng.random() < 0.2:
            body["cache_salt"] = f"{rng.getrandbits(64):016x}"
        if rng.random() < 0.2:
            body["chat_template_kwargs"] = {"enable_thinking": rng.random() < 0.5}
        tenant = tenant_id(rng.choice(["sk-one"] * 8 + ["sk-two", None]))
        fields = prefix_fields(body)
        a = whole.examine("qwen", body, tenant, fields)
        b = viewed.examine("qwen", lint_view(body), tenant, fields)
        assert a.warnings == b.warnings, i
        assert [e.to_json(True) for e in a.drifts] == [e.to_json(True) for e in b.drifts], i
        kinds.update(a.warnings)
        drifts += len(a.drifts)
    assert kinds == {"cache_salt", "request_id", "tool_order", "timestamp"} and drifts > 0
    assert whole.group_summaries(50, True) == viewed.group_summaries(50, True)


async def test_a_drift_found_in_the_linters_process_is_logged_and_counted_here(
        service: LintService, caplog: pytest.LogCaptureFixture) -> None:
    async with running(service) as live:
        with caplog.at_level(logging.WARNING, logger="prefixgate.lint"):
            for i in range(14):
                await decide(live, decided(chat(POLICY, f"question {i}")))
            for i in range(6):
                stamped = POLICY.replace("Returns are", f"Now: 2026-12-06 07:{10 + i}:0{i}. "
                                         "Returns are", 1)
                await decide(live, decided(chat(stamped)))
            await until(lambda: service.drift_events() != [], "the drift reported")
    [event] = service.drift_events()
    assert event.path == "messages[0].content" and event.kind == "timestamp"
    # counted in tokens by the model's tokenizer (the child loads it for this), not bytes
    assert event.lost_tokens is not None and 0 < event.lost_tokens < event.lost_chars / 2
    [line] = [r.getMessage() for r in caplog.records if "prefix drift" in r.getMessage()]
    assert f"group {event.group}" in line and "Returns" not in line  # no prompt text


def test_a_followed_tokenizer_is_loaded_on_first_use_and_a_broken_one_once() -> None:
    loaded: list[str | None] = []

    def loader(folder: str | None) -> Any:
        loaded.append(folder)
        if folder == "/broken":
            raise OSError("no tokenizer.json")
        return ByteRenderer()

    hashers = HasherSet([], loader=loader)
    hashers.follow("m", "/models/m")
    hashers.follow("m", "/models/m")
    assert loaded == [] and hashers.choice("m") is not None
    assert hashers.get("m") is hashers.get("m") and loaded == ["/models/m"]
    hashers.follow("b", "/broken")
    hashers.get("b")
    hashers.get("b")
    hashers.follow("b", "/broken")
    assert loaded == ["/models/m", "/broken"]
    choice = hashers.choice("b")
    assert choice is not None and choice.source == "bytes"
