"""The replica pool: health, load and cache facts about every replica.

Each replica gets its own probe loop (a slow replica never delays another):
``GET /health``; when that answers 200, ``GET /metrics`` (vLLM's running /
waiting / KV usage / prefix-cache counters, block size and capacity from
``vllm:cache_config_info``) and, now and then, ``GET /v1/models``.

Each replica has a circuit breaker (``engine.pool.breaker``): ``fail_threshold``
failed probes in a row (a failed probe is retried at once, so a replica that
stops answering is out within about two probe timeouts), a request the request
path reports as failed (unreachable, or no first byte in time), or a time to
first token much slower than its peers' (``SlowDetector``) open it; after the
cool-down one trial — a probe or a request — goes through (half-open) and a
good one closes it. A replica is ``healthy`` while its breaker is closed; a
half-open one is a routing candidate (``snapshot``) until its trial is taken.
Listeners hear every change of health (policies drop what they knew).

In-flight accounting is the gateway's own: ``with pool.lease(id, prefill_tokens)
as lease:`` counts a request from the moment it is sent until its last byte,
whatever way it ends, and its prompt tokens as the replica's unconfirmed
prefill until ``report_first_byte(lease, ttft)`` confirms them or the lease
ends (:mod:`engine.pool.prefill`: the queue drains at the replica's measured speed
meanwhile, so a non-streaming request's prefill does not count until its
whole answer is back). Each first token's time, with the work the request
found queued plus its own, feeds the slow-replica detector
(:mod:`engine.pool.slow`), which judges a replica by the time it takes for the
work it was given, not by raw latency.
``snapshot()`` returns frozen :class:`policies.types.ReplicaView` values, so a
policy decides on a consistent picture with no awaits inside.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import orjson

from engine.backends.base import Backend
from engine.errors import EngineError
from engine.pool.breaker import COOLDOWN, BreakerSettings, CircuitBreaker, Reason, State
from engine.pool.prefill import PrefillQueue
from engine.pool.scrape import ReplicaMetrics, parse_vllm_metrics
from engine.pool.slow import SlowDetector, SlowSettings
from engine.tasks import cancel
from policies.types import ReplicaView

log = logging.getLogger("prefixgate.pool")

HealthListener = Callable[[str, bool], None]

FAIL_THRESHOLD = 2
"""Failed probes in a row before a replica leaves rotation (the settings' default)."""
DRAIN_POLL = 0.05
"""Seconds between two looks at a leaving replica's in-flight count."""
PREFILL_SECONDS_PER_TOKEN = 0.0001
"""The prefill speed a replica's queue of unconfirmed prefill is assumed to drain at
between two first tokens (10k tokens/s; ``engine.pool.prefill``), unless the pool is
given another: the gateway gives it the cost model's ``prefill_seconds_per_token``, so
the queue a request is priced behind drains at the speed it is priced at."""


@dataclass(frozen=True, slots=True)
class ReplicaSpec:
    id: str
    url: str
    model: str | None = None
    """Model the replica serves; discovered from ``/v1/models`` when not given."""
    kind: str = "remote"
    block_size: int | None = None
    """KV block size; read from the replica's metrics when not given."""
    planned_blocks: int = 0
    """KV blocks to assume while the replica's metrics publish no capacity (0: unknown)."""


@dataclass(slots=True)
class Replica:
    spec: ReplicaSpec
    backend: Backend
    healthy: bool = False
    inflight: int = 0
    remote_inflight: int = 0
    """Requests other gateway instances have in flight here (shared routing state)."""
    metrics: ReplicaMetrics = field(default_factory=ReplicaMetrics)
    served_models: tuple[str, ...] = ()
    models_refused: bool = False
    """Its ``/v1/models`` answered 401 or 403 (said once)."""
    model_cards: dict[str, dict[str, object]] = field(default_factory=dict)
    """Each served model's entry of ``/v1/models`` as the replica sent it (vLLM's
    ``max_model_len``, ``permission``, ``owned_by``, ``root``...), by model id."""
    last_error: str | None = None
    last_probe: float | None = None
    consecutive_failures: int = 0
    probes: int = 0
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    """Starts open with its cool-down behind it: the first probe is its trial."""
    inflight_at_scrape: int = 0
    """The gateway's requests in flight there (all instances') when ``metrics`` was read."""
    prefill: PrefillQueue = field(default_factory=PrefillQueue)
    """The prefill the gateway sent here that the replica has not confirmed."""
    measured_seconds_per_token: float | None = None
    """Its prefill speed as its times to first token say (``engine.pool.slow``; ops view)."""
    progressed_at: float = -math.inf
    """A time the replica is known to have made progress after: its last first byte,
    or the scrape before the one whose token counters had moved."""
    scraped_at: float = -math.inf
    checking: asyncio.Task[None] | None = None
    """The health check a broken connection started (``ReplicaPool.report_broken``)."""
    broken_checks: dict[str, int] = field(default_factory=lambda: {"healthy": 0, "failed": 0})
    """What those checks found."""

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def models(self) -> tuple[str, ...]:
        if self.served_models:
            return self.served_models
        if self.spec.model:
            return (self.spec.model,)
        return self.metrics.model_names

    def block_size(self, default: int) -> int:
        return self.spec.block_size or self.metrics.block_size or default

    @property
    def capacity_blocks(self) -> int:
        """KV blocks the replica holds: as it publishes them, else as planned, else 0."""
        return self.metrics.num_gpu_blocks or self.spec.planned_blocks

    @property
    def capacity_source(self) -> str | None:
        if self.metrics.num_gpu_blocks:
            return "replica"
        return "plan" if self.spec.planned_blocks else None

    def view(self, default_block_size: int, now: float, seconds_per_token: float
             ) -> ReplicaView:
        # The engine's counts as best known now: other clients' requests as of the last
        # scrape (the engine's counts then, less what the gateway had in flight there),
        # plus the gateway's own now. The raw scrape lags by up to a probe interval: a
        # burst that just ended still ran there, and a replica it ran on looked loaded
        # to the whole next burst.
        m, inflight = self.metrics, self.inflight + self.remote_inflight
        foreign = max(0, m.running + m.waiting - self.inflight_at_scrape)
        foreign_waiting = min(m.waiting, foreign)
        pending = self.prefill.requests
        left, prefilled = self.prefill.progress(now, seconds_per_token)
        return ReplicaView(
            id=self.spec.id,
            healthy=self.breaker.admits(now),
            inflight=inflight,
            running=foreign - foreign_waiting + max(0, inflight - pending),
            waiting=foreign_waiting + min(pending, inflight),
            kv_usage=self.metrics.kv_usage,
            block_size=self.block_size(default_block_size),
            block_capacity=self.capacity_blocks,
            pending_requests=pending,
            pending_prefill_tokens=left,
            prefilled_requests=prefilled,
        )


@dataclass(slots=True)
class Lease:
    """One request on one replica, from the moment it is sent until it ends."""

    replica: Replica
    prefill_tokens: int
    """The prompt tokens it must prefill there (its uncached part, as predicted)."""
    work: int
    """Those, plus the unconfirmed prefill queued ahead of it when it was sent."""
    trial: bool
    """It is the replica's half-open trial."""
    ticket: int = 0
    """Its place in the replica's prefill queue."""
    sent_at: float = 0.0
    """The pool's clock when the request was sent."""
    prefilled: bool = False
    """Its prefill is settled: confirmed (first token) or left with the request."""


class ReplicaPool:
    def __init__(
        self,
        replicas: Sequence[tuple[ReplicaSpec, Backend]],
        health_interval: float = 1.0,
        fail_threshold: int = FAIL_THRESHOLD,
        models_every: int = 10,
        default_block_size: int = 16,
        clock: Callable[[], float] = time.monotonic,
        cooldown: float = COOLDOWN,
        slow: SlowSettings | None = None,
        prefill_seconds_per_token: float = PREFILL_SECONDS_PER_TOKEN,
    ) -> None:
        ids = [spec.id for spec, _ in replicas]
        if len(set(ids)) != len(ids):
            raise ValueError(f"replica ids must be unique: {ids}")
        self.fail_threshold = max(1, fail_threshold)
        self._clock = clock
        self.breaker_settings = BreakerSettings(fail_threshold=self.fail_threshold,
                                                cooldown=cooldown)
        self._replicas = {spec.id: Replica(spec, backend, breaker=self.new_breaker())
                          for spec, backend in replicas}
        self.slow = SlowDetector(slow or SlowSettings())
        self.health_interval = health_interval
        self.models_every = max(1, models_every)
        self.default_block_size = default_block_size
        if prefill_seconds_per_token <= 0:
            raise ValueError("prefill_seconds_per_token must be positive")
        self.prefill_seconds_per_token = prefill_seconds_per_token
        """The speed unconfirmed prefill is assumed to drain at (``PREFILL_SECONDS_PER_TOKEN``)."""
        self._listeners: list[HealthListener] = []
        self.on_inflight: Callable[[], None] | None = None
        """Called as a lease starts or ends (the pool's own in-flight count changed):
        a gateway's worker tells its siblings (``gateway.fleet.local``)."""
        self._tasks: list[asyncio.Task[None]] = []
        self._models_refreshed = -math.inf

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        """Probe every replica once (so readiness is known), then keep probing."""
        await asyncio.gather(*(self.probe(r) for r in self._replicas.values()))
        for replica in self._replicas.values():
            self._tasks.append(asyncio.create_task(self._probe_loop(replica),
                                                   name=f"probe-{replica.id}"))

    async def aclose(self) -> None:
        await cancel(*self._tasks, *(r.checking for r in self._replicas.values()))
        self._tasks.clear()
        await asyncio.gather(*(r.backend.aclose() for r in self._replicas.values()),
                             return_exceptions=True)

    def add_listener(self, listener: HealthListener) -> None:
        self._listeners.append(listener)

    # -- views ---------------------------------------------------------------

    def __iter__(self) -> Iterator[Replica]:
        return iter(self._replicas.values())

    def __len__(self) -> int:
        return len(self._replicas)

    def get(self, replica_id: str) -> Replica:
        return self._replicas[replica_id]

    def snapshot(self, model: str | None = None) -> list[ReplicaView]:
        """Every replica (serving ``model``); ``healthy`` there means "may be routed to
        now": a closed breaker, or a half-open one whose trial is not taken."""
        now = self._clock()
        speed = self.prefill_seconds_per_token
        return [r.view(self.default_block_size, now, speed) for r in self._replicas.values()
                if model is None or model in r.models]

    def serving(self, model: str) -> list[Replica]:
        return [r for r in self._replicas.values() if model in r.models]

    def healthy_models(self) -> list[str]:
        seen: dict[str, None] = {}
        for replica in self._replicas.values():
            if replica.healthy:
                for model in replica.models:
                    seen.setdefault(model, None)
        return list(seen)

    def known_models(self) -> list[str]:
        seen: dict[str, None] = {}
        for replica in self._replicas.values():
            for model in replica.models:
                seen.setdefault(model, None)
        return list(seen)

    # -- membership (replica discovery: engine.pool.discovery) -------------------------

    async def add_replica(self, spec: ReplicaSpec, backend: Backend) -> Replica:
        """A replica joins the started pool: probed once now, then by its own loop."""
        if spec.id in self._replicas:
            raise ValueError(f"replica id {spec.id!r} is already in the pool")
        replica = Replica(spec, backend, breaker=self.new_breaker())
        self._replicas[spec.id] = replica
        await self.probe(replica)
        self._tasks.append(asyncio.create_task(self._probe_loop(replica),
                                               name=f"probe-{spec.id}"))
        return replica

    async def remove_replica(self, replica_id: str, drain_seconds: float) -> int:
        """A replica leaves: out of rotation now, dropped (backend closed) once its
        in-flight requests have ended or ``drain_seconds`` have passed. Returns the
        requests still in flight when it was dropped."""
        replica = self._replicas[replica_id]
        name = f"probe-{replica_id}"
        probing = [task for task in self._tasks if task.get_name() == name]
        self._tasks = [task for task in self._tasks if task.get_name() != name]
        await cancel(*probing)
        replica.breaker.drain(self._clock())
        replica.last_error = "left the replica set (draining)"
        self._sync(replica)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._drained(replica), drain_seconds)
        del self._replicas[replica_id]
        with contextlib.suppress(Exception):
            await replica.backend.aclose()
        return replica.inflight

    @staticmethod
    async def _drained(replica: Replica) -> None:
        while replica.inflight:
            await asyncio.sleep(DRAIN_POLL)

    # -- accounting ------------------------------------------------------------

    @contextlib.contextmanager
    def lease(self, replica_id: str, prefill_tokens: int = 0) -> Iterator[Lease]:
        """Count a request on the replica, and its ``prefill_tokens`` as unconfirmed
        prefill there; a half-open replica's first request is its trial."""
        replica = self._replicas[replica_id]
        now = self._clock()
        replica.inflight += 1
        if self.on_inflight is not None:
            self.on_inflight()
        ticket, ahead = replica.prefill.add(prefill_tokens, now, self.prefill_seconds_per_token)
        lease = Lease(replica, prefill_tokens, ahead + prefill_tokens,
                      trial=replica.breaker.attempt(now), ticket=ticket, sent_at=now)
        try:
            yield lease
        finally:
            replica.inflight -= 1
            if self.on_inflight is not None:
                self.on_inflight()
            self._settle(lease)
            replica.breaker.attempt_ended(lease.trial)

    def _settle(self, lease: Lease, confirmed: bool = False) -> None:
        if not lease.prefilled:
            lease.prefilled = True
            lease.replica.prefill.settle(lease.ticket, self._clock(),
                                         self.prefill_seconds_per_token, confirmed)

    def remote_sent(self, replica_id: str, prefill_tokens: int) -> int | None:
        """Another worker of this gateway sent a request with ``prefill_tokens`` to
        prefill to the replica: it joins this pool's view of the replica's prefill queue
        (its ticket; None for a replica this pool does not know). Its in-flight count
        comes with the worker's load (``set_remote_inflight``)."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return None
        ticket, _ = replica.prefill.add(prefill_tokens, self._clock(),
                                        self.prefill_seconds_per_token)
        return ticket

    def remote_settled(self, replica_id: str, ticket: int, confirmed: bool) -> None:
        """That request's first byte came (``confirmed``), or it left without one."""
        replica = self._replicas.get(replica_id)
        if replica is not None:
            replica.prefill.settle(ticket, self._clock(), self.prefill_seconds_per_token,
                                   confirmed)

    def set_remote_inflight(self, counts: Mapping[str, int]) -> None:
        """Other gateway instances' in-flight requests per replica (absent: none); the
        load a policy sees is this plus the pool's own leases."""
        for replica in self._replicas.values():
            replica.remote_inflight = counts.get(replica.id, 0)

    def new_breaker(self) -> CircuitBreaker:
        """A breaker with the pool's settings (for a replica added later, too)."""
        return CircuitBreaker(self.breaker_settings, now=self._clock())

    def report_failure(self, replica_id: str, error: str) -> None:
        """The request path could not reach the replica, or got no first byte in
        time: open its breaker now."""
        replica = self._replicas[replica_id]
        replica.last_error = error
        replica.breaker.request_failed(self._clock())
        self._sync(replica)

    def report_broken(self, replica_id: str, error: str) -> None:
        """A request's connection to the replica broke after it arrived there (reset,
        closed, a body cut short). A dying replica does that to every request; a bug for
        one request (vLLM cutting one answer short, say) only to that one, while the
        replica serves the rest. So the breaker opens only if the replica then fails a
        health check, started now (one at a time); a trial that breaks reopens it."""
        replica = self._replicas[replica_id]
        replica.last_error = error
        if replica.breaker.state is not State.CLOSED:
            self.report_failure(replica_id, error)
            return
        if replica.checking is None:
            replica.checking = asyncio.get_running_loop().create_task(
                self._check_broken(replica, error), name=f"check-{replica.id}")

    async def _check_broken(self, replica: Replica, error: str) -> None:
        try:
            try:
                status, _ = await replica.backend.get("/health")
                failed = None if status == 200 else f"/health answered {status}"
            except EngineError as exc:
                failed = exc.detail
            replica.broken_checks["failed" if failed else "healthy"] += 1
            if failed is None:
                log.warning("replica %s stays in rotation: a request's connection broke "
                            "(%s), and the replica answers its health check", replica.id, error)
                return
            replica.last_error = f"{error}; then {failed}"
            replica.breaker.request_failed(self._clock())
            self._sync(replica)
        finally:
            replica.checking = None

    def report_first_byte(self, lease: Lease, ttft: float | None,
                          prefilled: bool = True) -> None:
        """The replica answered the lease's request (``ttft``: a stream's time to first
        token; ``prefilled``: a successful answer, so its prefill is done). A trial
        closes the breaker unless it is still slow; a replica much slower than its
        peers for the same work opens it."""
        self._settle(lease, confirmed=prefilled)
        replica = lease.replica
        replica.progressed_at = self._clock()
        replica_id, breaker = replica.id, replica.breaker
        peers = [r.id for r in self._replicas.values()
                 if r.id != replica_id and r.breaker.state is State.CLOSED]
        slow = False
        if ttft is not None:
            if breaker.state is State.CLOSED:
                self.slow.record(replica_id, ttft, lease.work)
                replica.measured_seconds_per_token = self.slow.seconds_per_token(replica_id)
                slow = self.slow.is_slow(replica_id, peers)
            else:
                slow = self.slow.trial_is_slow(ttft, lease.work, peers)
        if slow:
            replica.last_error = ("much slower than its peers for the same work "
                                  "(time to first token for its queued and uncached tokens)")
        breaker.success(self._clock(), slow=slow)
        self._sync(replica)

    def worked_after(self, lease: Lease) -> bool:
        """Whether the lease's replica is known to have made progress after the lease's
        request was sent to it (another request's first byte, or token counters that
        moved): then that request did not stop it on arrival."""
        return lease.replica.progressed_at > lease.sent_at

    def pending_prefill(self, replica_id: str) -> tuple[int, int]:
        """(requests, prompt tokens) the gateway sent to the replica whose prefill it
        has not confirmed yet: the queue a new request joins (estimated as it drains)."""
        replica = self._replicas[replica_id]
        return replica.prefill.requests, replica.prefill.tokens(
            self._clock(), self.prefill_seconds_per_token)

    def working_through_a_queue(self, replica_id: str, within: float) -> bool:
        """Whether a request still waiting for its first token on the replica is queued
        rather than lost: the replica made progress in the last ``within`` seconds (a
        first byte, or its token counters moved) and has other requests waiting (in
        its engine's queue, or the gateway's own not yet prefilled there)."""
        replica = self._replicas[replica_id]
        return (self._clock() - replica.progressed_at <= within
                and (replica.metrics.waiting > 0 or replica.prefill.requests > 1))

    def admits(self, replica_id: str) -> bool:
        """Whether a request may be sent to the replica now (in rotation, or its trial)."""
        return self._replicas[replica_id].breaker.admits(self._clock())

    def breaker_state(self, replica_id: str) -> State:
        return self._replicas[replica_id].breaker.tick(self._clock())

    def tripped(self, replica_id: str) -> bool:
        """Whether the replica's breaker is open because it failed (not for slowness):
        requests still waiting on it are better sent elsewhere."""
        breaker = self._replicas[replica_id].breaker
        return breaker.state is State.OPEN and breaker.reason is Reason.FAILING

    # -- probing -----------------------------------------------------------------

    async def _probe_loop(self, replica: Replica) -> None:
        while True:
            if not (replica.breaker.state is State.CLOSED and replica.breaker.failures):
                # A failed probe of a replica in rotation is retried at once.
                await asyncio.sleep(self.health_interval)
            await self.probe(replica)

    async def probe(self, replica: Replica) -> None:
        replica.probes += 1
        replica.last_probe = self._clock()
        try:
            status, _ = await replica.backend.get("/health")
            if status != 200:
                raise EngineError(replica.id, f"/health answered {status}")
            # The engine counted the gateway's requests at some instant while the scrape
            # was on its way: as many as were in flight when it left, or when its answer
            # was read, whichever was more. Taking only the later count called the
            # requests that ended meanwhile (the end of a burst) other clients' load,
            # and kept the next burst off that replica until the next scrape.
            inflight_sent = replica.inflight + replica.remote_inflight
            status, body = await replica.backend.get("/metrics")
            if status == 200:
                before, replica.metrics = (replica.metrics,
                                           parse_vllm_metrics(body.decode("utf-8", "replace")))
                replica.inflight_at_scrape = max(inflight_sent,
                                                 replica.inflight + replica.remote_inflight)
                if (replica.metrics.generation_tokens > before.generation_tokens
                        or replica.metrics.prompt_tokens > before.prompt_tokens):
                    # the tokens came some time after the previous scrape
                    replica.progressed_at = max(replica.progressed_at, replica.scraped_at)
                replica.scraped_at = self._clock()
            if not replica.served_models or replica.probes % self.models_every == 0:
                await self._models(replica)
        except EngineError as exc:
            replica.last_error = exc.detail
            replica.breaker.probe_failed(self._clock())
            self._sync(replica)
            return
        replica.breaker.success(self._clock(), from_probe=True)
        self._sync(replica)

    async def refresh_models(self, min_interval: float = 1.0) -> bool:
        """Ask every replica in rotation for its ``/v1/models`` now, at most once per
        ``min_interval`` seconds (a model loaded since the last probe, such as a LoRA
        adapter loaded at run time, is otherwise known only at the next models probe);
        whether it asked."""
        now = self._clock()
        if now - self._models_refreshed < min_interval:
            return False
        self._models_refreshed = now
        await asyncio.gather(*(self._models(r) for r in self._replicas.values() if r.healthy),
                             return_exceptions=True)
        return True

    async def _models(self, replica: Replica) -> None:
        status, body = await replica.backend.get("/v1/models")
        if status in (401, 403) and not replica.models_refused:
            replica.models_refused = True  # said once: vLLM started with --api-key
            log.warning("replica %s answers %d to /v1/models: it takes an API key (vLLM's "
                        "--api-key), which the gateway does not send: give it with "
                        "--replica-api-key or PREFIXGATE_REPLICA_API_KEY (replicas[].api_key for "
                        "one replica). Until then routing cannot read "
                        "its models' names and tokenizers (clients' own keys still pass "
                        "through to it)", replica.id, status)
        if status != 200:
            return
        try:
            data = orjson.loads(body).get("data", [])
            cards = [item for item in data if isinstance(item, dict) and "id" in item]
        except (orjson.JSONDecodeError, AttributeError):
            return
        replica.model_cards = {str(card["id"]): card for card in cards}
        served = tuple(replica.model_cards)
        configured = replica.spec.model
        if configured and served and configured not in served \
                and served != replica.served_models:
            # Said once per list it reports: requests for the configured name get 404.
            log.warning("replica %s serves %s, not the configured model %r (--model, "
                        "replicas[].model): requests for %r get 404 until they agree",
                        replica.id, ", ".join(served), configured, configured)
        replica.served_models = served

    def model_root(self, model: str) -> str | None:
        """What a replica serving ``model`` reports as its root (the first that does)."""
        for replica in self._replicas.values():
            root = replica.model_cards.get(model, {}).get("root")
            if isinstance(root, str) and root:
                return root
        return None

    def model_parent(self, model: str) -> str | None:
        """The served model a LoRA adapter belongs to (its card's ``parent``, as vLLM lists
        an adapter: ``--lora-modules`` or one loaded at run time); None for a base model."""
        for replica in self._replicas.values():
            card = replica.model_cards.get(model)
            if card is not None:
                parent = card.get("parent")
                return parent if isinstance(parent, str) and parent != model else None
        return None

    def tokenizer_root(self, model: str) -> str | None:
        """Where ``model``'s tokenizer and chat template are: its root, or for a LoRA
        adapter its base model's (vLLM renders an adapter's requests with those)."""
        parent = self.model_parent(model)
        return self.model_root(parent if parent is not None else model)

    def model_cards(self) -> list[dict[str, object]]:
        """The ``/v1/models`` entries of the healthy replicas, one per model id (the
        first replica's), in replica order; a model a replica serves without listing
        it (configured, not yet probed) has none."""
        cards: dict[str, dict[str, object]] = {}
        for replica in self._replicas.values():
            if replica.healthy:
                for model_id, card in replica.model_cards.items():
                    cards.setdefault(model_id, card)
        return list(cards.values())

    def _sync(self, replica: Replica) -> None:
        """``healthy`` follows the breaker: in rotation while it is closed."""
        breaker = replica.breaker
        replica.consecutive_failures = breaker.failures
        healthy = breaker.state is State.CLOSED
        if not healthy and replica.healthy:
            self.slow.forget(replica.id)
        self._set_health(replica, healthy)

    def _set_health(self, replica: Replica, healthy: bool) -> None:
        if replica.healthy == healthy:
            return
        replica.healthy = healthy
        if healthy:
            log.info("replica %s is healthy", replica.id)
        else:
            log.warning("replica %s left rotation: %s", replica.id, replica.last_error)
        for listener in self._listeners:
            listener(replica.id, healthy)
