"""The smallest replica count whose replay meets a TTFT target, and the replays it took.

Search. Replays get faster to refuse than to pass (an overloaded replay stops
at the first certain miss: ``gateway.replay.fleet``), and TTFT at a quantile
falls as replicas are added, so: first double from ``min_replicas`` until a
count meets the target (or ``max_replicas`` is reached), then bisect between
the largest count that missed and the smallest that met. With ``jobs``
worker processes each round replays ``jobs`` counts at once: the next
``jobs`` doublings, then ``jobs`` points spread over the open interval.
Counts are assumed to help monotonically; every count replayed is in the
result, so a table or a plot shows where that held.

Workers. The workload's prompts are hashed once in this process
(``Workload.prepare``) before the worker processes are forked; each inherits
the workload and its hashes (copy-on-write, nothing pickled) through its
initializer and keeps them for every replay it runs; progress comes back
through a queue. ``jobs=1`` replays in this process. (Before, each worker
hashed the whole trace itself: on the Mooncake trace ``--jobs 2`` took 85 s
where one process took 60.)
"""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, replace
from typing import Self

from gateway.replay.fleet import FleetSpec, replay
from gateway.replay.outcome import ReplayOutcome
from gateway.replay.workload import Workload

Report = Callable[[dict[int, tuple[int, int]]], None]
"""Told, as replays progress, each running count's (requests done, requests in all)."""


@dataclass(frozen=True)
class Question:
    ttft_limit_s: float
    quantile: float = 0.99
    min_replicas: int = 1
    max_replicas: int = 64

    def __post_init__(self) -> None:
        if not 0 < self.quantile <= 1 or self.ttft_limit_s <= 0:
            raise ValueError("the quantile must be in (0, 1] and the TTFT limit positive")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError("need 1 <= min_replicas <= max_replicas")


@dataclass(frozen=True)
class SearchResult:
    question: Question
    answer: int | None
    """The smallest count that met the target; None: not even ``max_replicas``."""
    outcomes: dict[int, ReplayOutcome]


class Replays:
    """Runs replays of one workload for several replica counts (module docstring)."""

    def __init__(self, workload: Workload, spec: FleetSpec, jobs: int = 1,
                 report: Report | None = None) -> None:
        self.workload = workload
        self.spec = spec
        self.jobs = max(1, jobs)
        self.report = report
        self._pool: ProcessPoolExecutor | None = None
        self._queue: multiprocessing.Queue[tuple[int, int, int]] | None = None

    def __enter__(self) -> Self:
        if self.jobs > 1:
            # Hashed once here; forked workers inherit the hashes (nothing is pickled).
            self.workload.prepare(self.spec.block_size)
            context = multiprocessing.get_context("fork")
            self._queue = context.Queue()
            self._pool = ProcessPoolExecutor(self.jobs, mp_context=context,
                                             initializer=_start_worker,
                                             initargs=(self.workload, self._queue))
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def run(self, counts: Sequence[int]) -> dict[int, ReplayOutcome]:
        counts = sorted(set(counts))
        done: dict[int, tuple[int, int]] = {n: (0, len(self.workload)) for n in counts}
        if self._pool is None:
            out = {}
            for n in counts:
                def tell(progress: int, total: int, n: int = n) -> None:
                    done[n] = (progress, total)
                    if self.report is not None:
                        self.report(done)
                out[n] = replay(self.workload, replace(self.spec, replicas=n), tell)
            return out
        futures: dict[int, Future[ReplayOutcome]] = {
            n: self._pool.submit(_replay_in_worker, replace(self.spec, replicas=n))
            for n in counts}
        assert self._queue is not None
        while not all(f.done() for f in futures.values()):
            try:
                n, progress, total = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if n in done:
                done[n] = (progress, total)
                if self.report is not None:
                    self.report(done)
        return {n: future.result() for n, future in futures.items()}


_WORKER: dict[str, object] = {}
"""One worker process's own workload and progress queue (set by its initializer only)."""


def _start_worker(workload: Workload, progress: multiprocessing.Queue[tuple[int, int, int]]
                  ) -> None:
    _WORKER["workload"] = workload
    _WORKER["queue"] = progress


def _replay_in_worker(spec: FleetSpec) -> ReplayOutcome:
    workload = _WORKER["workload"]
    progress = _WORKER["queue"]
    assert isinstance(workload, Workload)

    def tell(done: int, total: int) -> None:
        progress.put((spec.replicas, done, total))  # type: ignore[attr-defined]

    return replay(workload, spec, tell)


def smallest_meeting(question: Question, replays: Replays) -> SearchResult:
    """The search of the module docstring."""
    outcomes: dict[int, ReplayOutcome] = {}
    batch = replays.jobs
    lo, hi = question.min_replicas - 1, None  # lo: largest count known to miss
    candidate = question.min_replicas
    while hi is None and candidate <= question.max_replicas:
        counts: list[int] = []
        while len(counts) < batch and candidate <= question.max_replicas:
            counts.append(candidate)
            candidate = candidate * 2
        if counts[-1] < question.max_replicas < candidate:
            candidate = question.max_replicas  # the top of the range is tried too
        outcomes.update(replays.run(counts))
        for n in counts:
            if outcomes[n].meets:
                hi = n
                break
            lo = n
    if hi is None:
        return SearchResult(question, None, outcomes)
    while hi - lo > 1:
        span = hi - lo
        step = span / (min(batch, span - 1) + 1)
        counts = sorted({lo + max(1, round(step * (i + 1))) for i in range(min(batch, span - 1))}
                        - {hi})
        outcomes.update(replays.run(counts))
        for n in counts:
            if outcomes[n].meets:
                hi = n
                break
            lo = n
    return SearchResult(question, hi, outcomes)
