"""Engine loop and latency model of the simulated replica (vLLM V1 style).

Continuous batching in steps. Each step, with a budget of
``max_num_batched_tokens`` tokens:

1. Running requests first, in admission order: one token each when
   decoding, or the next chunk of their prompt (chunked prefill). A request
   that needs a new block when none is free preempts the most recently
   admitted running request (its blocks are freed, it goes back to the front
   of the queue and later recomputes from its prefix-cache hits).
2. If nothing was preempted, waiting requests are admitted in arrival order
   while fewer than ``max_num_seqs`` run and budget remains: the prefix cache
   supplies the longest cached block prefix, the rest needs fresh blocks. The
   first request that cannot get its blocks stops admission (FCFS); it and
   everyone behind it stay waiting (``vllm:num_requests_waiting``).
3. Blocks that become full are registered in the prefix cache as each
   request is scheduled, as vLLM's ``allocate_slots`` does: a waiting request
   admitted after another in the same pass finds the blocks that one is about
   to compute (vLLM 0.32, ``KVCacheManager.allocate_slots`` caches up to the
   tokens scheduled before the next request's ``get_computed_blocks``).

The step then "runs" for::

    step_overhead_s + prefill_tokens * prefill_per_token_s
                    + sampling_seqs * decode_per_seq_s

modeled seconds (sleeping that divided by ``time_scale``), after which every
request whose prompt is fully computed samples one token. ``sampling_seqs``
are those requests: every decoding one, and every prompt whose last chunk the
step computes -- the per-sequence work (sampling, output handling) is the
same for both. TTFT therefore grows with uncached prompt tokens and with
queueing; time per output token grows with the batch.

Time. ``now`` is modeled time. It advances by step durations while there is
work, and follows the wall clock (times ``time_scale``) while idle, so Python
overhead never leaks into the metrics of a busy engine. Requests arriving
mid-step are stamped with the modeled time elapsed in that step. The wall
clock and the sleep function are injected, so tests drive :meth:`step`
directly without sleeping.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from engine.sim.cache import PrefixCache
from engine.sim.config import SimConfig
from engine.sim.events import CacheEvent
from engine.sim.request import EngineRequest, Status, TokenEvent


class EngineObserver(Protocol):
    """What the engine reports to metrics (see ``engine.sim.metrics``)."""

    def on_step(
        self, running: int, waiting: int, kv_usage: float, scheduled_tokens: int
    ) -> None: ...

    def on_admitted(
        self, request: EngineRequest, queried_tokens: int, hit_tokens: int, first_admission: bool
    ) -> None: ...

    def on_token(self, request: EngineRequest, now: float) -> None: ...

    def on_finished(self, request: EngineRequest, reason: str, now: float) -> None: ...

    def on_preempted(self, request: EngineRequest) -> None: ...


class NullObserver:
    def on_step(self, running: int, waiting: int, kv_usage: float, scheduled_tokens: int) -> None:
        pass

    def on_admitted(
        self, request: EngineRequest, queried_tokens: int, hit_tokens: int, first_admission: bool
    ) -> None:
        pass

    def on_token(self, request: EngineRequest, now: float) -> None:
        pass

    def on_finished(self, request: EngineRequest, reason: str, now: float) -> None:
        pass

    def on_preempted(self, request: EngineRequest) -> None:
        pass


@dataclass(frozen=True, slots=True)
class ScheduledStep:
    start: float
    duration: float
    work: tuple[tuple[EngineRequest, int], ...]
    prefill_tokens: int
    decode_seqs: int
    sampling_seqs: int = 0
    """Requests that sample a token at the end of the step (decoding or prompt done)."""


class Engine:
    def __init__(
        self,
        config: SimConfig,
        cache: PrefixCache,
        observer: EngineObserver | None = None,
        publish: Callable[[list[CacheEvent]], None] | None = None,
        wall_clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self.cache = cache
        self.observer: EngineObserver = observer or NullObserver()
        self._publish = publish
        self._wall = wall_clock
        self._sleep = sleep
        self.waiting: deque[EngineRequest] = deque()
        self._queued = 0
        """Waiting requests the last schedule could not admit (reported as waiting)."""
        self.running: list[EngineRequest] = []
        self.now = 0.0
        self._wall_at_now = wall_clock()
        self._inflight: float | None = None
        self._wake = asyncio.Event()

    # -- time ---------------------------------------------------------------

    def model_now(self) -> float:
        elapsed = (self._wall() - self._wall_at_now) * self.config.time_scale
        if self._inflight is not None:
            elapsed = min(elapsed, self._inflight)
        return self.now + max(elapsed, 0.0)

    def step_duration(self, prefill_tokens: int, sampling_seqs: int) -> float:
        config = self.config
        return (
            config.step_overhead_s
            + prefill_tokens * config.prefill_per_token_s
            + sampling_seqs * config.decode_per_seq_s
        )

    # -- requests -----------------------------------------------------------

    def add(self, request: EngineRequest) -> None:
        request.arrival_time = self.model_now()
        request.status = Status.WAITING
        self.cache.extend_hashes(request.block_hashes, request.token_ids, request.cache_salt)
        self.waiting.append(request)
        # Not reported here: like vLLM, the state is reported per step, and a
        # request the next step admits is never seen waiting.
        self._wake.set()

    def abort(self, request: EngineRequest) -> None:
        """Drop a request (client went away); frees its blocks at once."""
        if request.status is Status.WAITING:
            self.waiting.remove(request)
            self._queued = min(self._queued, len(self.waiting))
        elif request.status is Status.RUNNING:
            self.running.remove(request)
            self._free_blocks(request)
        else:
            return
        request.status = Status.ABORTED
        self.observer.on_finished(request, "abort", self.model_now())
        self._report_state(0)

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        if reset_running_requests:
            while self.running:
                self._preempt(self.running.pop())
        done = self.cache.reset()
        self._flush_events()
        return done

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- one step -------------------------------------------------------------

    def schedule(self) -> ScheduledStep:
        budget = self.config.max_num_batched_tokens
        work: list[tuple[EngineRequest, int]] = []
        preempted = False
        position = 0
        while position < len(self.running) and budget > 0:
            request = self.running[position]
            wanted = min(request.num_tokens - request.num_computed_tokens, budget)
            scheduled = True
            while not self._grow(request, request.num_computed_tokens + wanted):
                victim = self.running.pop()
                self._preempt(victim)
                preempted = True
                if victim is request:
                    scheduled = False
                    break
            if not scheduled:
                break
            work.append((request, wanted))
            self._commit_full_blocks(request, request.num_computed_tokens + wanted)
            budget -= wanted
            position += 1
        if not preempted:
            budget = self._admit(work, budget)
        self._queued = len(self.waiting)
        decode_seqs = sum(1 for request, _ in work if request.is_decoding)
        prefill_tokens = sum(count for request, count in work if not request.is_decoding)
        sampling_seqs = sum(1 for request, count in work
                            if request.num_computed_tokens + count == request.num_tokens)
        return ScheduledStep(
            start=self.now,
            duration=self.step_duration(prefill_tokens, sampling_seqs) if work else 0.0,
            work=tuple(work),
            prefill_tokens=prefill_tokens,
            decode_seqs=decode_seqs,
            sampling_seqs=sampling_seqs,
        )

    def finish(self, step: ScheduledStep) -> list[TokenEvent]:
        """Advance modeled time past ``step`` and sample the tokens it produced."""
        self.now = step.start + step.duration
        self._wall_at_now = self._wall()
        self._inflight = None
        events: list[TokenEvent] = []
        for request, count in step.work:
            if request.status is not Status.RUNNING:
                continue  # aborted or preempted while the step ran
            request.num_computed_tokens += count
            if request.num_computed_tokens == request.num_tokens:
                events.append(self._sample(request))
        self._flush_events()
        self._report_state(step.prefill_tokens + step.decode_seqs)
        return events

    def wake(self) -> None:
        """Leave idleness: modeled time catches up with the wall clock (``run`` does it on
        the first request after a pause; a replay that drives steps itself, too)."""
        self.now = self.model_now()
        self._wall_at_now = self._wall()

    def step(self) -> list[TokenEvent]:
        """Schedule and finish one step without sleeping (tests, benchmarks)."""
        return self.finish(self.schedule())

    async def run(self) -> None:
        """The engine loop; runs until cancelled."""
        while True:
            if not self.has_work:
                self._wake.clear()
                await self._wake.wait()
                self.wake()
            # The step's wall time starts before scheduling, so the simulator's
            # own bookkeeping is part of the modeled step, not added to it.
            deadline = self._wall()
            step = self.schedule()
            if not step.work:
                # Nothing can move until a request arrives or is aborted.
                self._wake.clear()
                await self._wake.wait()
                continue
            self._inflight = step.duration
            deadline += step.duration / self.config.time_scale
            await self._sleep(max(deadline - self._wall(), 0.0))
            self.finish(step)

    # -- internals ------------------------------------------------------------

    def _admit(self, work: list[tuple[EngineRequest, int]], budget: int) -> int:
        cache, size = self.cache, self.config.block_size
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            hit = cache.lookup(request.block_hashes, request.num_tokens)
            computed = len(hit) * size
            wanted = min(request.num_tokens - computed, budget)
            needed = math.ceil((computed + wanted) / size) - len(hit)
            # Hit blocks that sit in the free queue stop being evictable once taken.
            reclaimable = sum(1 for block_id in hit if cache.ref_count(block_id) == 0)
            if needed > cache.num_free_blocks - reclaimable:
                break
            cache.acquire(hit)
            fresh = cache.allocate(needed)
            assert fresh is not None
            self.waiting.popleft()
            request.block_ids = hit + fresh
            request.num_computed_tokens = computed
            request.num_cached_blocks = len(hit)
            request.status = Status.RUNNING
            if request.num_cached_tokens < 0:
                request.num_cached_tokens = computed
            first_admission = request.first_scheduled_time is None
            if first_admission:
                request.first_scheduled_time = self.now
            self.running.append(request)
            self.observer.on_admitted(request, request.num_tokens, computed, first_admission)
            work.append((request, wanted))
            # Registered now, as vLLM's allocate_slots does, so a request admitted after
            # it in this same pass finds its prefix (a burst shares one prefill).
            self._commit_full_blocks(request, computed + wanted)
            budget -= wanted
        return budget

    def _grow(self, request: EngineRequest, num_tokens: int) -> bool:
        needed = math.ceil(num_tokens / self.config.block_size) - len(request.block_ids)
        if needed <= 0:
            return True
        fresh = self.cache.allocate(needed)
        if fresh is None:
            return False
        request.block_ids.extend(fresh)
        return True

    def _commit_full_blocks(self, request: EngineRequest, num_tokens: int) -> None:
        self.cache.extend_hashes(request.block_hashes, request.token_ids, request.cache_salt)
        request.num_cached_blocks = self.cache.commit(
            request.block_ids,
            request.block_hashes,
            request.token_ids,
            request.num_cached_blocks,
            num_tokens // self.config.block_size,
            request.cache_salt,
        )

    def _preempt(self, request: EngineRequest) -> None:
        self._free_blocks(request)
        request.num_computed_tokens = 0
        request.status = Status.WAITING
        self.waiting.appendleft(request)
        self.observer.on_preempted(request)

    def _free_blocks(self, request: EngineRequest) -> None:
        self.cache.release(list(reversed(request.block_ids)))
        request.block_ids = []
        request.num_cached_blocks = 0

    def _sample(self, request: EngineRequest) -> TokenEvent:
        step = request.output.next_token()
        request.token_ids.append(step.token_id)
        if request.first_token_time is None:
            request.first_token_time = self.now
        self.observer.on_token(request, self.now)
        request.last_token_time = self.now
        event = TokenEvent(
            index=request.index,
            delta_text=step.delta_text,
            token_id=step.token_id,
            num_output_tokens=request.num_output_tokens,
            num_prompt_tokens=request.num_prompt_tokens,
            num_cached_tokens=max(request.num_cached_tokens, 0),
            finish_reason=step.finish_reason,
            stop_reason=step.stop_reason,
            token_text=step.token_text,
        )
        if step.finish_reason is not None:
            self.running.remove(request)
            self._free_blocks(request)
            request.status = Status.FINISHED
            self.observer.on_finished(request, step.finish_reason, self.now)
        request.emit(event)
        return event

    def _flush_events(self) -> None:
        events = self.cache.take_events()
        if events and self._publish is not None:
            self._publish(events)

    def _report_state(self, scheduled_tokens: int) -> None:
        # Waiting = what the last schedule left in the queue (vLLM's stats come
        # from the scheduler after scheduling), not requests that arrived since.
        self.observer.on_step(
            len(self.running), self._queued, self.cache.usage, scheduled_tokens
        )
