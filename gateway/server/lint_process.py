"""The prompt linter on live traffic, in a process of its own (``lint.worker: process``).

The serving process keeps what it must answer at once: the ``x-prefixgate-lint``
header (``LintService.known``: a hash and a lookup), the findings' and drift
counters, the drift events and the ops dashboard's feeds
(``LintService.record_many``). The lint itself (the detector over each new
field, the groups that learn which spans vary, the drift tracker) runs in a
child process, ``python -m gateway.server.lint_process``, started with the
gateway. Each decided chat request with a prompt is queued for it: its key, the
model and its tokenizer folder, the tenant's hash, its prefix fields and
``lint_view`` (never the last turn). ``/admin/drift`` asks the child for its groups.

Why a process: a worker thread in the serving process (``gateway.server.live_lint``,
the default) lints off the loop but not off the interpreter; while both want it
they take turns. Here the serving process does none of the linter's work, a lint
that cannot finish (``STALL_SECONDS``) is ended with its process, and the linter
can run on a core the gateway does not use. The child runs at a lower priority
(``NICE``): on a busy machine the serving process's CPU comes first. Measured on
2 cores (docs/benchmarks/overhead.md, issue 25) it did not pay for itself in
CPU: 0.99-1.07x the thread's a request, TTFT within noise, whether the lint was
cheap (warm system prompts) or not (a new 2,000-token one each request).

What a hop costs is paid per batch, not per request: the queue is written to
the socket every ``SEND_SECONDS`` (or at ``BATCH_REQUESTS``), and the child
reports back only what changed: the warnings of a stable prefix it has not
reported with that count (the next request's header), drift events and failures
at once; the counts of findings and of requests done every ``REPORT_SECONDS``.
One process's table of what was reported and the other's of what it was told
(``LintService.known``) see the same keys put in the same order, so they hold
the same keys. A request sent one at a time and answered one at a time cost
more CPU than the thread it replaced (a system call and a wake-up each way, on
the loop and in the child).

Its CPU is bounded as the thread's is (``cpu_share``, ``gateway.lint.budget``):
requests beyond it are skipped in the child and reported, counted as dropped.
Bounded as the thread's queue was: at most ``QUEUE_REQUESTS`` requests wait for
the child (queued here or sent and not reported done); more are not linted and
``prefixgate_lint_dropped_total`` counts them. Nothing on the loop blocks: the
socket is non-blocking, what it does not take at once waits for the loop to say
it is writable. When the child ends (killed, out of memory) what it held is
counted as dropped, ``prefixgate_lint_process_restarts_total`` counts it and a
new one starts (after ``RESTART_SECONDS``, doubling up to ``RESTART_MAX_SECONDS``
while it keeps ending before reporting); one that holds requests and reports
nothing for ``STALL_SECONDS`` (stuck on a prompt, stopped) is ended the same way.
Requests meanwhile go on unlinted. The linter only observes: nothing here fails a request.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from gateway.lint.budget import CpuBudget
from gateway.lint.service import LintService, prefix_key, tenant_id
from gateway.lint.structure import TextField, lint_view, prefix_fields
from gateway.ops.metrics import GatewayMetrics
from gateway.request.exchange import Exchange
from gateway.request.lifecycle import Silent, after_send
from gateway.server.live_lint import is_linted, linted_body
from policies.lru import LRU

log = logging.getLogger("prefixgate.lint")

QUEUE_REQUESTS = 1024
"""Requests queued for the linter's process or sent and not reported done, at most."""

QUEUE_BYTES = 32 << 20
"""Bytes waiting in this process to be written to it, at most."""

SEND_SECONDS = 0.02
"""How long a request waits here to be sent with the ones after it."""

BATCH_REQUESTS = 256
"""Requests sent at once, at most (a full batch goes at once)."""

REPORT_SECONDS = 0.25
"""How often the child reports the requests it has done when nothing else changed."""

NICE = 10
"""The linter's process's niceness above the gateway's."""

RESTART_SECONDS = 1.0
RESTART_MAX_SECONDS = 30.0

GROUPS_TIMEOUT_SECONDS = 5.0
"""How long ``/admin/drift`` waits for the linter's process to list its groups."""

CLOSE_SECONDS = 10.0
"""How long closing waits for the requests sent to be linted."""

STALL_SECONDS = 30.0
"""A child that holds requests and reports nothing for this long is stuck (a prompt
the detector cannot get through, a stopped process): it is ended and replaced."""

_HEADER = 4
_MAX_FAILURES_LOGGED = 8
"""Failures the child reports in one report, at most (the rest are counted)."""

_Item = tuple[int, str, "str | None", str, dict[str, Any], list[tuple[Any, ...]]]
"""A request for the child: key, model, tokenizer folder, tenant hash, view, fields."""


def _frame(message: Any) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return len(data).to_bytes(_HEADER, "big") + data


def _frames(buffer: bytearray) -> list[Any]:
    """The complete messages at the front of ``buffer``, taken out of it."""
    out, start = [], 0
    while len(buffer) - start >= _HEADER:
        end = start + _HEADER + int.from_bytes(buffer[start:start + _HEADER], "big")
        if len(buffer) < end:
            break
        out.append(pickle.loads(buffer[start + _HEADER:end]))
        start = end
    del buffer[:start]
    return out


class LintProcess(Silent):
    """A lifecycle observer that has each decided chat request linted in the child."""

    def __init__(self, lint: LintService, metrics: GatewayMetrics,
                 capacity: int = QUEUE_REQUESTS, max_bytes: int = QUEUE_BYTES,
                 restart_seconds: float = RESTART_SECONDS,
                 send_seconds: float = SEND_SECONDS,
                 stall_seconds: float = STALL_SECONDS, cpu_share: float = 0.0) -> None:
        self.lint = lint
        self.metrics = metrics
        self.capacity = capacity
        self.max_bytes = max_bytes
        self.restart_seconds = restart_seconds
        self.send_seconds = send_seconds
        self.stall_seconds = stall_seconds
        self.cpu_share = cpu_share
        self._heard = 0.0  # when the child last reported (loop time)
        self._watch: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._sock: socket.socket | None = None
        self._batch: list[_Item] = []  # queued here, not sent yet
        self._flush_at: asyncio.TimerHandle | None = None
        self._out = bytearray()  # frames the socket has not taken yet
        self._in = bytearray()
        self._sent = 0  # requests in the child (sent, not reported done)
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._ids = itertools.count(1)
        self._failures = 0
        self._restart: asyncio.TimerHandle | None = None
        self._closing = False
        self._reported: asyncio.Event | None = None

    # -- the child's life ------------------------------------------------------------------

    def start(self) -> None:
        """Start the child (on the serving loop)."""
        self._loop = asyncio.get_running_loop()
        self._reported = asyncio.Event()
        self._spawn()
        self._watch = self._loop.call_later(min(self.stall_seconds / 4, 1.0), self._check_stall)

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return self._proc.pid if self._proc is not None and self._sock is not None else None

    def _spawn(self) -> None:
        self._restart = None
        if self._closing:
            return
        ours, theirs = socket.socketpair()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "gateway.server.lint_process", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, env=_child_env())
        except OSError as exc:
            ours.close()
            log.error("the prompt linter's process did not start (%s): live requests are "
                      "not linted", exc)
            return
        finally:
            theirs.close()
        ours.setblocking(False)
        self._sock = ours
        assert self._loop is not None
        self._heard = self._loop.time()
        lint = self.lint
        self._send(_frame(("setup", lint.limits, lint.drift_settings, lint.hashers.limits,
                           self.cpu_share)))
        assert self._loop is not None
        self._loop.add_reader(ours, self._readable)

    def _ended(self) -> None:
        """The child's end of the socket closed: count what it held, start another."""
        sock, proc = self._sock, self._proc
        if sock is None or self._loop is None:
            return
        self._loop.remove_reader(sock)
        self._loop.remove_writer(sock)
        sock.close()
        self._sock = None
        self._out.clear()
        self._in.clear()
        lost = self._sent + len(self._batch)
        if lost:
            self.metrics.lint_dropped.inc(lost)
        self._sent = 0
        self._batch.clear()
        self._wake_closer()
        for call in self._calls.values():
            if not call.done():
                call.set_result(None)
        if self._closing:
            return
        self.lint.forget_known()  # the next child tells every prefix's warnings anew
        code = proc.poll() if proc is not None else None
        self.metrics.lint_process_restarts.inc()
        delay = min(self.restart_seconds * 2 ** self._failures, RESTART_MAX_SECONDS)
        self._failures += 1
        log.warning("the prompt linter's process ended (exit code %s); starting another in "
                    "%.0f s, requests meanwhile are not linted", code, delay)
        if proc is not None:
            threading.Thread(target=proc.wait, daemon=True).start()  # reap it
        self._restart = self._loop.call_later(delay, self._spawn)

    def _check_stall(self) -> None:
        """End a child that holds requests and has not reported for ``stall_seconds``
        (its end is noticed as any other: ``_ended``)."""
        assert self._loop is not None
        self._watch = self._loop.call_later(min(self.stall_seconds / 4, 1.0), self._check_stall)
        proc = self._proc
        if (self._sent and self._sock is not None and proc is not None
                and self._loop.time() - self._heard > self.stall_seconds):
            log.warning("the prompt linter's process held %d requests and reported nothing "
                        "for %.0f s: ending it", self._sent, self.stall_seconds)
            proc.kill()

    async def aclose(self) -> None:
        """Let the child lint what was queued (``CLOSE_SECONDS`` at most), then end it."""
        self._closing = True
        if self._watch is not None:
            self._watch.cancel()
        if self._restart is not None:
            self._restart.cancel()
        self._flush()
        if self._sent and self._reported is not None:
            try:
                await asyncio.wait_for(self._all_reported(), CLOSE_SECONDS)
            except TimeoutError:
                log.warning("the prompt linter's process had %d requests left at close",
                            self._sent)
        self._ended()
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            await asyncio.to_thread(_reap, proc)

    async def _all_reported(self) -> None:
        assert self._reported is not None
        while self._sent and self._sock is not None:
            self._reported.clear()
            await self._reported.wait()

    def _wake_closer(self) -> None:
        if self._reported is not None:
            self._reported.set()

    # -- requests ------------------------------------------------------------------------

    def queued(self) -> int:
        """Requests waiting to be linted now (``prefixgate_lint_queue_requests``)."""
        return self._sent + len(self._batch)

    def on_decided(self, exchange: Exchange) -> None:
        if is_linted(exchange):
            after_send(self.take, exchange)

    def take(self, exchange: Exchange) -> None:
        """The header's lookup, and the request queued for the child (on the loop)."""
        model, body, tenant = exchange.model, linted_body(exchange), exchange.tenant
        try:
            fields = prefix_fields(body)
            key = prefix_key(model, tenant, fields)
            exchange.lint_warnings = self.lint.known(key)
            if (self._sock is None or self._sent + len(self._batch) >= self.capacity
                    or len(self._out) >= self.max_bytes):
                self.metrics.lint_dropped.inc()
                return
            self._batch.append((key, model, self.lint.folder(model), tenant_id(tenant),
                                lint_view(body), [_field(f) for f in fields]))
        except Exception as exc:  # noqa: BLE001 - the linter observes; it never fails a request
            log.warning("prompt lint could not read a request (%s)", type(exc).__name__)
            return
        if len(self._batch) >= BATCH_REQUESTS:
            self._flush()
        elif self._flush_at is None and self._loop is not None:
            self._flush_at = self._loop.call_later(self.send_seconds, self._flush)

    def _flush(self) -> None:
        """Send what is queued, as one message."""
        if self._flush_at is not None:
            self._flush_at.cancel()
            self._flush_at = None
        batch, self._batch = self._batch, []
        if not batch:
            return
        try:
            frame = _frame(("lint", batch))
        except (RecursionError, pickle.PicklingError, TypeError, ValueError):
            frame = b""  # one request's view would not go: send the others
            for item in batch[:]:
                try:
                    frame += _frame(("lint", [item]))
                except (RecursionError, pickle.PicklingError, TypeError, ValueError):
                    batch.remove(item)
                    self.metrics.lint_dropped.inc()
                    log.warning("prompt lint could not send a request (too deep to encode)")
        if batch and self._send(frame):
            self._sent += len(batch)
        elif batch:
            self.metrics.lint_dropped.inc(len(batch))

    async def group_summaries(self, n: int, include_text: bool) -> list[dict[str, Any]] | None:
        """What the child's groups learned (``LintService.group_summaries``); None when it
        is not running or does not answer within ``GROUPS_TIMEOUT_SECONDS``."""
        if self._sock is None or self._loop is None:
            return None
        call_id = next(self._ids)
        future: asyncio.Future[Any] = self._loop.create_future()
        self._calls[call_id] = future
        try:
            self._flush()  # it answers after what was queued before the call
            if not self._send(_frame(("groups", call_id, n, include_text))):
                return None
            return await asyncio.wait_for(future, GROUPS_TIMEOUT_SECONDS)
        except TimeoutError:
            return None
        finally:
            self._calls.pop(call_id, None)

    # -- the socket (non-blocking, on the loop) ------------------------------------------------

    def _send(self, frame: bytes) -> bool:
        """Whether the frame (``_frame``) is on its way (written, or waiting for the
        socket)."""
        sock = self._sock
        if sock is None:
            return False
        if self._out:
            self._out += frame
            return True
        try:
            sent = sock.send(frame)
        except BlockingIOError:
            sent = 0
        except OSError:
            self._ended()
            return False
        if sent < len(frame):
            self._out += memoryview(frame)[sent:]
            assert self._loop is not None
            self._loop.add_writer(sock, self._writable)
        return True

    def _writable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            sent = sock.send(self._out)
        except BlockingIOError:
            return
        except OSError:
            self._ended()
            return
        del self._out[:sent]
        if not self._out and self._loop is not None:
            self._loop.remove_writer(sock)

    def _readable(self) -> None:
        sock = self._sock
        if sock is None:
            return
        try:
            chunk = sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._ended()
            return
        self._in += chunk
        for message in _frames(self._in):
            self._on_message(message)

    def _on_message(self, message: tuple[Any, ...]) -> None:
        if message[0] == "groups":
            call = self._calls.get(message[1])
            if call is not None and not call.done():
                call.set_result(message[2])
            return
        _, done, counts, kinds, drifts, failures, more_failures, skipped = message  # "report"
        if skipped:  # beyond its share of a core (lint.cpu_share)
            self.metrics.lint_dropped.inc(skipped)
        assert self._loop is not None
        self._heard = self._loop.time()
        self._sent = max(0, self._sent - done)
        self._failures = 0
        self.lint.record_many(counts, kinds, drifts)
        for where in failures:  # the type and the line: never the message (prompt text)
            log.warning("prompt lint failed on a request (it was routed without it): %s",
                        where)
        if more_failures:
            log.warning("prompt lint failed on %d more requests", more_failures)
        if not self._sent:
            self._wake_closer()


def _field(field: TextField) -> tuple[Any, ...]:
    return (field.path, field.text, field.region, field.message, field.tool)


def _child_env() -> dict[str, str]:
    """The child finds this package where the serving process found it."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), root]))
    return env


def _reap(proc: subprocess.Popen[bytes]) -> None:
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# -- the child ---------------------------------------------------------------------------------


class _Child:
    """The linter's process: one thread reads the socket, lints in the order requests
    came, answers ``groups`` between them, and reports (``_report``)."""

    def __init__(self, sock: socket.socket, service: LintService, budget: CpuBudget) -> None:
        self.sock = sock
        self.service = service
        self.budget = budget
        self.skipped = 0
        self.told: LRU[int, int] = LRU(service.limits.memo_entries)
        """What the serving process was told each key's warnings are (it keeps the same)."""
        self.done = 0
        self.counts: dict[int, int] = {}
        self.kinds: dict[str, int] = {}
        self.drifts: list[Any] = []
        self.failures: list[str] = []
        self.more_failures = 0
        self.last_report = time.monotonic()

    def run(self, buffer: bytearray) -> None:
        while True:
            for message in _frames(buffer):
                if message[0] == "groups":
                    self.sock.sendall(_frame(("groups", message[1], self.service.group_summaries(
                        message[2], message[3]))))
                else:
                    for item in message[1]:
                        self.lint(*item)
                        self._report(due_only=True)  # a long batch: every REPORT_SECONDS
            self._report()
            try:
                if not select.select([self.sock], [], [], REPORT_SECONDS)[0]:
                    continue
                chunk = self.sock.recv(1 << 20)
            except OSError:
                return
            if not chunk:
                break
            buffer += chunk
        self._report(final=True)

    def lint(self, key: int, model: str, folder: str | None, tenant_hash: str,
             view: dict[str, Any], fields: list[tuple[Any, ...]]) -> None:
        service = self.service
        self.done += 1
        if not self.budget.allows():  # its share of a core is spent (lint.cpu_share)
            self.skipped += 1
            return
        started = time.thread_time()
        try:
            service.hashers.follow(model, folder)
            examined = service.examine(model, view, tenant_hash, [TextField(*f) for f in fields])
        except Exception as exc:  # noqa: BLE001 - reported, and the next request goes on
            if len(self.failures) < _MAX_FAILURES_LOGGED:
                self.failures.append(_where(exc))
            else:
                self.more_failures += 1
            return
        finally:
            self.budget.charge(time.thread_time() - started)
        for kind in examined.warnings:
            self.kinds[kind] = self.kinds.get(kind, 0) + 1
        self.drifts.extend(examined.drifts)
        n = len(examined.warnings)
        if self.told.peek(key) != n:
            self.told.put(key, n)
            self.counts.pop(key, None)  # the order the serving process puts them in
            self.counts[key] = n

    def _report(self, final: bool = False, due_only: bool = False) -> None:
        """Send what changed at once (a prefix's warnings, a drift, a failure); the
        counts every ``REPORT_SECONDS``. ``due_only``: only when that is due (between
        the requests of one batch, so that a batch is reported once)."""
        urgent = (self.counts or self.drifts or self.failures) and not due_only
        if not (urgent or final) and not (
                self.done and time.monotonic() - self.last_report >= REPORT_SECONDS):
            return
        if not (self.done or urgent):
            return
        self.sock.sendall(_frame(("report", self.done, self.counts, self.kinds, self.drifts,
                                  self.failures, self.more_failures, self.skipped)))
        self.done, self.counts, self.kinds, self.drifts = 0, {}, {}, []
        self.failures, self.more_failures, self.skipped = [], 0, 0
        self.last_report = time.monotonic()


def _where(exc: BaseException) -> str:
    """An exception's type and the line it came from: never its message (prompt text)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = f" at {Path(tb.tb_frame.f_code.co_filename).name}:{tb.tb_lineno}" if tb else ""
    return f"{type(exc).__name__}{where}"


def main(argv: list[str]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C on the gateway: it closes us
    try:
        os.nice(NICE)
    except OSError:
        pass
    sock = socket.socket(fileno=int(argv[0]))
    buffer = bytearray()
    while not (messages := _frames(buffer)):
        chunk = sock.recv(1 << 20)
        if not chunk:
            return
        buffer += chunk
    setup = messages[0]
    if setup[0] != "setup":
        return
    from gateway.prompt.hashers import HasherSet
    limits, drift, hash_limits, share = setup[1], setup[2], setup[3], setup[4]
    service = LintService(HasherSet([], limits=hash_limits), [], None, limits=limits, drift=drift)
    # what came with the setup is at the front again, as it was sent
    again = b"".join(_frame(m) for m in messages[1:])
    _Child(sock, service, CpuBudget(share)).run(bytearray(again) + buffer)


if __name__ == "__main__":
    main(sys.argv[1:])
