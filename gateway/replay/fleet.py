"""The replay: a trace through the gateway's own policy onto N simulated engines, in
simulated time.

Why this and not the real gateway in front of ``prefixgate sim`` processes: a
what-if is a search (one replay per replica count, per KV size, per policy),
and a live replay runs at the trace's own pace -- an hour of traffic is an hour
per point -- on a machine whose CPUs the gateway, the sims and the client then
share, so the measurement drifts with the load it measures. Here nothing waits
and nothing is shared; what is faithful is kept:

* the engines are the simulator's own (``engine.sim.scheduler.Engine``: vLLM
  V1's continuous batching, chunked prefill, FCFS admission, preemption, the
  block pool and its prefix cache with vLLM's eviction order), stepped by
  hand with the fitted latency model (``engine.sim.latency``); the same
  engine ``prefixgate sim`` serves with;
* the policy is the gateway's own, built from the same registry with the
  same options, told what the gateway tells it (``sent``, then ``prefilled``
  at the first token -- at the whole answer for a request not streamed); a
  policy that learns from KV events (``precise``) gets the engines' events
  ``event_delay_s`` after each step;
* what the policy sees of each replica is what the gateway's pool shows it
  (``engine.pool.replicas.Replica.view``): the gateway's own requests in flight,
  those without a first token as queued with their predicted prefill in an
  unconfirmed-prefill queue (``engine.pool.prefill.PrefillQueue``, drained at
  the pool's assumed speed), the KV usage as of the last scrape.

What is outside the engines: a request's time outside the engine's steps
(the serving front, the gateway and its hop) is the latency model's
``request_overhead_s``, added to every TTFT and answer end as the caller
would see them; the engines and the policy run on the engines' own clock.
Left out: other clients of the replicas, failures. A live check of one answer is a
``loadtest`` run of the same trace against ``prefixgate sim --latency-model``
replicas (docs: Capacity planning).

Time. Step ends and KV-event deliveries sit in a heap; arrivals come in trace
order. Events at the same instant: step ends and deliveries first, then every
arrival, then idle engines that got work start a step (requests arriving
together are scheduled together, as a real engine's loop would find them).

Readings. With ``readings_every_s`` each engine also keeps vLLM's metrics
(``engine.sim.metrics.SimMetrics``, the simulator's own copy of them) and the
replay reads them every that many simulated seconds, as ``prefixgate fit``
reads live replicas: what a fit of the simulated replicas would see.

Early stop. Given ``ttft_limit_s``, a replay ends as soon as more requests
have waited at least that long for their first token than the quantile allows
(``n - ceil(q * n)``): the answer "no" is then certain, and an overloaded
fleet -- the slowest replays of a search -- is not simulated to the end.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.pool.prefill import PrefillQueue
from engine.sim.cache import PrefixCache
from engine.sim.config import SimConfig
from engine.sim.events import CacheEvent, ClearedAll, RemovedBlocks, StoredBlocks
from engine.sim.latency import LatencyModel
from engine.sim.metrics import SimMetrics
from engine.sim.request import EngineRequest, TokenEvent
from engine.sim.scheduler import Engine, EngineObserver, ScheduledStep
from engine.sim.textgen import TokenStep
from gateway.replay.outcome import ReplayOutcome, ReplicaLoad, summarise
from gateway.replay.recorded_routing import RecordedRouting
from gateway.replay.scrape import Reading, parse_reading
from gateway.replay.workload import ReplayItem, Workload
from policies.base import Policy
from policies.cost_scorer import drain_seconds_per_token
from policies.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, KVEvent
from policies.registry import default_registry
from policies.simulate import ManualClock
from policies.types import ReplicaView, RouteRequest

RECORDED = "recorded"
"""Policy name for the replica each request was recorded on (checks a latency model)."""
Progress = Callable[[int, int], None]
_STEP, _DELIVER, _READ = 0, 1, 2


NULL_BLOCKS = 1
"""Blocks of vLLM's ``num_gpu_blocks`` it never hands out: ``BlockPool`` keeps one as the
null block. A replayed replica of ``num_blocks`` (as vLLM reports them in
``vllm:cache_config_info``, as ``--num-gpu-blocks-override`` sets them, as ``prefixgate plan``
counts them) caches in the rest."""


@dataclass(frozen=True)
class FleetSpec:
    replicas: int
    latency: LatencyModel
    num_blocks: int
    """vLLM's ``num_gpu_blocks`` of each replica (``NULL_BLOCKS`` of them never hold KV)."""
    block_size: int
    policy: str = "prefix"
    policy_options: Mapping[str, Any] = field(default_factory=dict)
    event_delay_s: float = 0.005
    scrape_interval_s: float = 1.0
    """How stale the KV usage a policy sees is (the gateway's ``health_interval``)."""
    ttft_limit_s: float | None = None
    quantile: float = 0.99
    readings_every_s: float | None = None
    """Read each engine's vLLM metrics this often (simulated seconds); None: keep none."""

    def __post_init__(self) -> None:
        if self.replicas <= 0 or self.block_size <= 0:
            raise ValueError("replicas and block_size must be positive")
        if self.num_blocks <= NULL_BLOCKS:
            raise ValueError(f"num_blocks must be more than vLLM's {NULL_BLOCKS} null block")

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - NULL_BLOCKS

    def engine_config(self) -> SimConfig:
        params, limits = self.latency.params, self.latency
        return SimConfig(block_size=self.block_size, num_blocks=self.usable_blocks,
                         max_model_len=self.usable_blocks * self.block_size,
                         max_num_seqs=limits.max_num_seqs,
                         max_num_batched_tokens=limits.max_num_batched_tokens,
                         step_overhead_s=params.step_overhead_s,
                         prefill_per_token_s=params.prefill_per_token_s,
                         decode_per_seq_s=params.decode_per_seq_s)


class _FixedOutput:
    """``output_length`` tokens, the last one finishing the sequence (``length``)."""

    __slots__ = ("_left",)
    _TOKEN = TokenStep(0, "", None, None)
    _LAST = TokenStep(0, "", "length", None)

    def __init__(self, tokens: int) -> None:
        self._left = tokens

    def next_token(self) -> TokenStep:
        self._left -= 1
        return self._LAST if self._left <= 0 else self._TOKEN


class _Flight:
    """One request on its way: what the gateway would track for it."""

    __slots__ = (
        "engine_request",
        "finished",
        "first_token",
        "fleet",
        "item",
        "replica",
        "route_request",
        "ticket",
    )

    def __init__(self, fleet: _Fleet, item: ReplayItem, route_request: RouteRequest,
                 replica: _Replica, ticket: int) -> None:
        self.fleet = fleet
        self.item = item
        self.route_request = route_request
        self.replica = replica
        self.ticket = ticket
        self.first_token: float | None = None
        self.finished: float | None = None
        self.engine_request: EngineRequest | None = None

    def emit(self, event: TokenEvent) -> None:
        now = self.fleet.clock.now
        if self.first_token is None:
            self.first_token = now
            self.fleet.first_token(self, now)
        if event.finish_reason is not None:
            self.finished = now
            self.fleet.finished(self, now)


class _Replica:
    """One simulated engine and what the gateway's pool knows of it."""

    def __init__(self, replica_id: str, spec: FleetSpec, clock: ManualClock,
                 publish: Callable[[list[CacheEvent]], None] | None) -> None:
        self.id = replica_id
        self.spec = spec
        config = spec.engine_config()
        self.counters = _Counters()
        # What its metrics report is vLLM's num_gpu_blocks, the null block counted.
        reported = replace(config, num_blocks=spec.num_blocks)
        self.metrics = SimMetrics(reported) if spec.readings_every_s else None
        observer: EngineObserver = (self.counters if self.metrics is None
                                    else _Both(self.counters, self.metrics))
        cache = PrefixCache(config.num_blocks, config.block_size,
                            record_events=publish is not None)
        self.engine = Engine(config, cache,
                             observer=observer, publish=publish, wall_clock=clock)
        self.step: ScheduledStep | None = None
        self.prefill = PrefillQueue()
        self.inflight = 0
        self.kv_seen = 0.0
        self._scraped_at = -math.inf
        self.busy_s = 0.0
        self.running_s = 0.0

    def view(self, now: float, seconds_per_token: float) -> ReplicaView:
        if now - self._scraped_at >= self.spec.scrape_interval_s:
            self.kv_seen, self._scraped_at = self.engine.cache.usage, now
        pending = self.prefill.requests
        left, prefilled = self.prefill.progress(now, seconds_per_token)
        return ReplicaView(
            id=self.id, inflight=self.inflight, running=max(0, self.inflight - pending),
            waiting=min(pending, self.inflight), kv_usage=self.kv_seen,
            block_size=self.spec.block_size, block_capacity=self.spec.num_blocks,
            pending_requests=pending, pending_prefill_tokens=left,
            prefilled_requests=prefilled)


class _Counters:
    """The engine's observer: only what the report needs."""

    __slots__ = ("peak_waiting", "preemptions")

    def __init__(self) -> None:
        self.preemptions = 0
        self.peak_waiting = 0

    def on_step(self, running: int, waiting: int, kv_usage: float, scheduled_tokens: int) -> None:
        self.peak_waiting = max(self.peak_waiting, waiting)

    def on_admitted(self, request: EngineRequest, queried_tokens: int, hit_tokens: int,
                    first_admission: bool) -> None:
        return None

    def on_token(self, request: EngineRequest, now: float) -> None:
        return None

    def on_finished(self, request: EngineRequest, reason: str, now: float) -> None:
        return None

    def on_preempted(self, request: EngineRequest) -> None:
        self.preemptions += 1


class _Both:
    """Two engine observers, told the same."""

    __slots__ = ("first", "second")

    def __init__(self, first: EngineObserver, second: EngineObserver) -> None:
        self.first, self.second = first, second

    def on_step(self, running: int, waiting: int, kv_usage: float, scheduled_tokens: int) -> None:
        self.first.on_step(running, waiting, kv_usage, scheduled_tokens)
        self.second.on_step(running, waiting, kv_usage, scheduled_tokens)

    def on_admitted(self, request: EngineRequest, queried_tokens: int, hit_tokens: int,
                    first_admission: bool) -> None:
        self.first.on_admitted(request, queried_tokens, hit_tokens, first_admission)
        self.second.on_admitted(request, queried_tokens, hit_tokens, first_admission)

    def on_token(self, request: EngineRequest, now: float) -> None:
        self.first.on_token(request, now)
        self.second.on_token(request, now)

    def on_finished(self, request: EngineRequest, reason: str, now: float) -> None:
        self.first.on_finished(request, reason, now)
        self.second.on_finished(request, reason, now)

    def on_preempted(self, request: EngineRequest) -> None:
        self.first.on_preempted(request)
        self.second.on_preempted(request)


def _policy_events(events: Sequence[CacheEvent]) -> tuple[KVEvent, ...]:
    """The engine's events as the gateway's KV-event subscriber decodes them."""
    out: list[KVEvent] = []
    for event in events:
        if isinstance(event, StoredBlocks):
            salt = event.extra_keys[0][0] if event.extra_keys and event.extra_keys[0] else None
            out.append(BlockStored(event.block_hashes, event.parent_block_hash, event.token_ids,
                                   event.block_size, medium="GPU", cache_salt=salt))
        elif isinstance(event, RemovedBlocks):
            out.append(BlockRemoved(event.block_hashes, medium="GPU"))
        elif isinstance(event, ClearedAll):
            out.append(AllBlocksCleared())
    return tuple(out)


class _Fleet:
    def __init__(self, workload: Workload, spec: FleetSpec, progress: Progress | None) -> None:
        self.workload = workload
        self.spec = spec
        self.progress = progress
        self.overhead = spec.latency.request_overhead_s
        self.clock = ManualClock()
        if spec.policy == RECORDED:
            self.policy: Policy = RecordedRouting.for_workload(workload, spec.replicas)
        else:
            self.policy = default_registry(clock=self.clock).create(spec.policy,
                                                                    spec.policy_options)
        self.drain = drain_seconds_per_token(spec.policy_options)
        """The speed unconfirmed prefill drains at, as the live gateway's pool assumes."""
        consumer = self.policy.event_consumer()
        self.consumer = consumer
        self.heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.replicas = [
            _Replica(replica_id, spec, self.clock,
                     self._publisher(replica_id) if consumer is not None else None)
            for replica_id in self.replica_ids()]
        if consumer is not None:
            for replica in self.replicas:
                consumer.set_model(replica.id, workload.model)
        self.by_id = {r.id: r for r in self.replicas}
        self.position = {r.id: i for i, r in enumerate(self.replicas)}
        n = len(workload)
        self.ttft: list[float | None] = [None] * n
        self.finish: list[float | None] = [None] * n
        self.cached: list[int] = [0] * n
        self.served_by: list[int] = [-1] * n
        self.reasons: Counter[str] = Counter()
        self.rejected = 0
        limit = spec.ttft_limit_s
        self.slow = 0
        self.slow_allowed = n - math.ceil(spec.quantile * n - 1e-9) if limit is not None else n
        self.stopped = False
        self._batch = 0
        self.readings: dict[str, list[Reading]] = {r.id: [] for r in self.replicas}
        if spec.readings_every_s:
            self.push(0.0, _READ, None)

    def replica_ids(self) -> list[str]:
        if isinstance(self.policy, RecordedRouting):
            return list(self.policy.replica_ids)
        return [f"r{i}" for i in range(self.spec.replicas)]

    # -- events --------------------------------------------------------------------

    def push(self, time: float, kind: int, payload: Any) -> None:
        heapq.heappush(self.heap, (time, self._seq, kind, payload))
        self._seq += 1

    def _publisher(self, replica_id: str) -> Callable[[list[CacheEvent]], None]:
        def publish(events: list[CacheEvent]) -> None:
            batch = EventBatch(seq=self._batch, timestamp=self.clock.now,
                               events=_policy_events(events))
            self._batch += 1
            self.push(self.clock.now + self.spec.event_delay_s, _DELIVER, (replica_id, batch))
        return publish

    def arrive(self, item: ReplayItem, now: float) -> _Replica | None:
        spec, workload = self.spec, self.workload
        block = spec.block_size
        if item.input_length + item.output_length > spec.usable_blocks * block:
            self.rejected += 1  # vLLM answers 400: longer than the model's context
            return None
        route = RouteRequest(
            model=workload.model, block_hashes=tuple(workload.route_hashes(item, block)),
            prompt_tokens=item.input_length, block_size=block,
            session_key=str(item.session) if item.session is not None else None,
            request_id=str(item.index))
        decision = self.policy.pick(route, [r.view(now, self.drain) for r in self.replicas])
        self.policy.sent(route, decision.replica_id)
        self.reasons[decision.reason] += 1
        replica = self.by_id[decision.replica_id]
        held = decision.matched_blocks.get(replica.id, 0) * block
        ticket, _ = replica.prefill.add(max(0, item.input_length - held), now, self.drain)
        flight = _Flight(self, item, route, replica, ticket)
        tokens = workload.prompt(item)
        request = EngineRequest(str(item.index), 0, tokens, _FixedOutput(item.output_length),
                                flight.emit, max_tokens=item.output_length)
        request.block_hashes = list(workload.engine_hashes(item, block, tokens))
        flight.engine_request = request
        replica.inflight += 1
        replica.engine.add(request)
        self.served_by[item.index] = self.position[replica.id]
        return replica

    def first_token(self, flight: _Flight, now: float) -> None:
        item = flight.item
        ttft = now - item.arrival + self.overhead
        self.ttft[item.index] = ttft
        request = flight.engine_request
        self.cached[item.index] = max(request.num_cached_tokens, 0) if request else 0
        if item.stream:
            self._prefilled(flight, now)
        limit = self.spec.ttft_limit_s
        if limit is not None and ttft >= limit:
            self.slow += 1
            if self.slow > self.slow_allowed:
                self.stopped = True

    def finished(self, flight: _Flight, now: float) -> None:
        self.finish[flight.item.index] = now + self.overhead
        if not flight.item.stream:  # the gateway learns at the whole answer
            self._prefilled(flight, now)
        flight.replica.inflight -= 1

    def _prefilled(self, flight: _Flight, now: float) -> None:
        flight.replica.prefill.settle(flight.ticket, now, self.drain, True)
        self.policy.prefilled(flight.route_request, flight.replica.id)

    def start_step(self, replica: _Replica, now: float) -> None:
        engine = replica.engine
        if replica.step is None:
            engine.wake()
        step = engine.schedule()
        if not step.work:
            replica.step = None
            return
        replica.step = step
        self.push(now + step.duration, _STEP, replica)

    def end_step(self, replica: _Replica, now: float) -> None:
        step = replica.step
        assert step is not None
        replica.busy_s += step.duration
        replica.running_s += step.duration * len(step.work)
        replica.engine.finish(step)
        if replica.engine.has_work:
            self.start_step(replica, now)
        else:
            replica.step = None

    # -- the loop ------------------------------------------------------------------

    def run(self) -> None:
        items = self.workload.items
        total = len(items)
        tick = max(1, total // 200)
        index = 0
        heap = self.heap
        while (index < total or heap) and not self.stopped:
            arrival = items[index].arrival if index < total else math.inf
            if heap and heap[0][0] <= arrival:
                now, _, kind, payload = heapq.heappop(heap)
                self.clock.now = now
                if kind == _STEP:
                    self.end_step(payload, now)
                elif kind == _READ:
                    self.read(now, more=index < total or len(heap) > 0)
                else:
                    assert self.consumer is not None
                    self.consumer.apply_events(*payload)
                continue
            self.clock.now = arrival
            woken: dict[str, _Replica] = {}
            while index < total and items[index].arrival == arrival:
                replica = self.arrive(items[index], arrival)
                if replica is not None and replica.step is None:
                    woken[replica.id] = replica
                index += 1
                if self.progress is not None and index % tick == 0:
                    self.progress(index, total)
            for replica in woken.values():
                self.start_step(replica, arrival)
        if self.progress is not None:
            self.progress(total, total)

    def read(self, now: float, more: bool) -> None:
        for replica in self.replicas:
            assert replica.metrics is not None
            self.readings[replica.id].append(
                parse_reading(replica.metrics.render().decode(), now))
        if more and self.spec.readings_every_s:
            self.push(now + self.spec.readings_every_s, _READ, None)

    def outcome(self) -> ReplayOutcome:
        loads = []
        for position, replica in enumerate(self.replicas):
            served = [i for i, r in enumerate(self.served_by) if r == position]
            items = self.workload.items
            loads.append(ReplicaLoad(
                id=replica.id, requests=len(served),
                prompt_tokens=sum(items[i].input_length for i in served),
                cached_tokens=sum(self.cached[i] for i in served),
                busy_s=replica.busy_s, running_s=replica.running_s,
                preemptions=replica.counters.preemptions,
                peak_waiting=replica.counters.peak_waiting))
        return summarise(self.workload, self.spec.replicas, self.spec.policy, self.ttft,
                         self.finish, self.cached, loads, dict(self.reasons), self.rejected,
                         self.stopped, self.spec.ttft_limit_s, self.spec.quantile)


def replay(workload: Workload, spec: FleetSpec, progress: Progress | None = None
           ) -> ReplayOutcome:
    """Replay ``workload`` on ``spec.replicas`` simulated replicas (module docstring)."""
    return replay_with_readings(workload, spec, progress)[0]


def replay_with_readings(workload: Workload, spec: FleetSpec, progress: Progress | None = None
                         ) -> tuple[ReplayOutcome, dict[str, list[Reading]]]:
    """``replay``, and each engine's metrics readings (``spec.readings_every_s``)."""
    fleet = _Fleet(workload, spec, progress)
    fleet.run()
    if spec.readings_every_s:
        fleet.read(fleet.clock.now, more=False)
    return fleet.outcome(), fleet.readings
