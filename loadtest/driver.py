"""Paces a workload's conversations against one OpenAI endpoint.

Closed loop: ``concurrency`` worker tasks each take the next conversation
when their previous one is finished. Open loop (Poisson or trace times): one
task per conversation, started at its ``arrival`` second; ``concurrency``,
when non-zero, caps requests in flight (a semaphore around each request).

Within a conversation turns are strictly sequential: turn ``k + 1`` is built
from the system prompt, every earlier user turn and the real answer text the
server streamed back (or, as the conversation says, one flattened message or
its scripted messages: :mod:`.transcript`), and is sent only after that
answer has arrived. A failed turn ends its conversation (the remaining
turns are counted as ``abandoned``: their prompt would depend on an answer
that never came).

The run is bounded: past ``max_duration`` seconds no new request is sent
(those are counted as ``unsent``), requests in flight finish or hit the
client's time-out. The prompts actually sent are kept with their send time
(``SentPrompt``) so the ideal cache bound can be computed from exactly what
the servers saw.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from loadtest.client import ChatCall, RequestRecord, StreamClient
from loadtest.progress import Progress
from loadtest.transcript import Transcript
from loadtest.workloads.base import Conversation, Workload


@dataclass(frozen=True, slots=True)
class SentPrompt:
    sent_at: float
    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...] = ()
    prompt: str | None = None
    """A completions request's text (``messages`` is then empty)."""

    @classmethod
    def of(cls, sent_at: float, call: ChatCall) -> SentPrompt:
        return cls(sent_at, call.messages, call.tools, call.prompt)


@dataclass(frozen=True)
class DriveResult:
    records: tuple[RequestRecord, ...]
    prompts: tuple[SentPrompt, ...]
    duration: float
    unsent: int
    abandoned: int


def clock_line(now: datetime) -> str:
    """The dynamic first line of a ``system_clock`` system prompt."""
    return f"Current date and time: {now:%Y-%m-%d %H:%M:%S}.{now.microsecond // 1000:03d}."


class _Run:
    def __init__(
        self,
        workload: Workload,
        client: StreamClient,
        model: str,
        clock: Callable[[], float],
        wall_clock: Callable[[], datetime],
        progress: Progress | None,
        max_duration: float | None,
    ) -> None:
        self.workload = workload
        self.client = client
        self.model = model
        self.clock = clock
        self.wall_clock = wall_clock
        self.progress = progress
        self.start = clock()
        self.deadline = None if max_duration is None else self.start + max_duration
        cap = workload.pacing.concurrency if workload.pacing.open_loop else 0
        self.limiter: Callable[[], contextlib.AbstractAsyncContextManager[object]]
        if cap:
            semaphore = asyncio.Semaphore(cap)
            self.limiter = lambda: semaphore
        else:
            self.limiter = contextlib.nullcontext
        self.records: list[RequestRecord] = []
        self.prompts: list[SentPrompt] = []
        self.unsent = 0
        self.abandoned = 0

    def expired(self) -> bool:
        return self.deadline is not None and self.clock() >= self.deadline

    def _system_text(self, conversation: Conversation) -> str | None:
        if conversation.system is None or not conversation.system_clock:
            return conversation.system
        return clock_line(self.wall_clock()) + "\n" + conversation.system

    async def conversation(self, conversation: Conversation) -> None:
        transcript = Transcript(conversation)
        for index, turn in enumerate(conversation.turns):
            if self.expired():
                self.unsent += len(conversation.turns) - index
                return
            async with self.limiter():
                call = transcript.call(index, turn, self._system_text(conversation),
                                       self.workload.ignore_eos)
                self.prompts.append(SentPrompt.of(self.clock() - self.start, call))
                if self.progress:
                    self.progress.inflight += 1
                outcome = await self.client.stream_chat(self.model, call, self.clock, self.start)
                if self.progress:
                    self.progress.inflight -= 1
                    self.progress.done += 1
                    self.progress.errors += outcome.record.error is not None
            self.records.append(outcome.record)
            if outcome.record.error is not None:
                self.abandoned += len(conversation.turns) - index - 1
                return
            transcript.answered(outcome.answer)

    async def closed_loop(self) -> None:
        queue = list(reversed(self.workload.conversations))

        async def worker() -> None:
            while queue:
                await self.conversation(queue.pop())

        await asyncio.gather(*(worker() for _ in range(self.workload.pacing.concurrency)))

    async def open_loop(self) -> None:
        tasks = []
        ordered = sorted(self.workload.conversations, key=lambda c: c.arrival)
        for index, conversation in enumerate(ordered):
            due = self.start + conversation.arrival
            if self.deadline is not None and due >= self.deadline:
                # the rest arrive later still: not sent, and not waited for
                self.unsent += sum(len(c.turns) for c in ordered[index:])
                break
            delay = due - self.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if self.expired():
                self.unsent += len(conversation.turns)
                continue
            tasks.append(asyncio.create_task(self.conversation(conversation)))
        await asyncio.gather(*tasks)


async def drive(
    workload: Workload,
    client: StreamClient,
    model: str,
    *,
    clock: Callable[[], float],
    wall_clock: Callable[[], datetime] = datetime.now,
    progress: Progress | None = None,
    max_duration: float | None = None,
) -> DriveResult:
    """Run every conversation of ``workload`` against ``client``; see module doc."""
    run = _Run(workload, client, model, clock, wall_clock, progress, max_duration)
    ticker = asyncio.create_task(progress.run()) if progress else None
    try:
        if workload.pacing.open_loop:
            await run.open_loop()
        else:
            await run.closed_loop()
    finally:
        if ticker:
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker
    records = sorted(run.records, key=lambda r: r.sent_at)
    return DriveResult(tuple(records), tuple(run.prompts), run.clock() - run.start,
                       run.unsent, run.abandoned)
