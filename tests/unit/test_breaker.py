"""The circuit breaker on a fake clock, and the pool that drives it and the slow-replica
detector (replicas faked with httpx.MockTransport, the pool's clock injected)."""

from __future__ import annotations

from engine.backends.base import Timeouts
from engine.backends.httpx_client import HttpxBackend
from engine.pool.breaker import BreakerSettings, CircuitBreaker, Reason, State
from engine.pool.replicas import ReplicaPool, ReplicaSpec
from engine.pool.slow import SlowSettings
from gateway.ops.breaker_metrics import BreakerCollector
from tests.unit.fake_replica import FakeReplica

COOLDOWN = 5.0


def closed_breaker(fail_threshold: int = 2) -> CircuitBreaker:
    return CircuitBreaker(BreakerSettings(fail_threshold=fail_threshold, cooldown=COOLDOWN),
                          now=0.0, closed=True)


def test_failed_probes_open_it_after_the_threshold_and_a_good_one_resets_the_count() -> None:
    breaker = closed_breaker(fail_threshold=3)
    breaker.probe_failed(1.0)
    breaker.probe_failed(2.0)
    breaker.success(3.0, from_probe=True)
    breaker.probe_failed(4.0)
    breaker.probe_failed(5.0)
    assert breaker.admits(5.0)
    breaker.probe_failed(6.0)
    assert breaker.state is State.OPEN and not breaker.admits(6.0)


def test_a_request_failure_opens_it_at_once() -> None:
    breaker = closed_breaker()
    breaker.request_failed(1.0)
    assert not breaker.admits(1.0)
    assert breaker.reason is Reason.FAILING


def test_after_the_cooldown_one_trial_goes_through_and_its_success_closes_it() -> None:
    breaker = closed_breaker()
    breaker.request_failed(10.0)
    assert not breaker.admits(10.0 + COOLDOWN - 0.1)
    assert breaker.admits(10.0 + COOLDOWN)
    assert breaker.state is State.HALF_OPEN
    assert breaker.attempt(15.0)           # the trial
    assert not breaker.admits(15.0)        # nobody else meanwhile
    assert not breaker.attempt(15.0)
    breaker.success(15.5)
    assert breaker.state is State.CLOSED and breaker.admits(15.5)


def test_a_failed_trial_opens_it_for_another_cooldown() -> None:
    breaker = closed_breaker()
    breaker.request_failed(0.0)
    assert breaker.attempt(COOLDOWN)
    breaker.request_failed(COOLDOWN + 1)
    assert not breaker.admits(2 * COOLDOWN)
    assert breaker.admits(2 * COOLDOWN + 1)


def test_a_trial_abandoned_without_a_verdict_frees_the_slot() -> None:
    breaker = closed_breaker()
    breaker.request_failed(0.0)
    trial = breaker.attempt(COOLDOWN)
    breaker.attempt_ended(trial)
    assert breaker.admits(COOLDOWN)


def test_a_failed_probe_in_half_open_opens_it_again() -> None:
    breaker = closed_breaker(fail_threshold=5)
    breaker.request_failed(0.0)
    breaker.probe_failed(COOLDOWN)
    assert breaker.state is State.OPEN


def test_a_new_breaker_lets_its_first_probe_decide() -> None:
    breaker = CircuitBreaker(BreakerSettings(cooldown=COOLDOWN), now=100.0)
    assert breaker.tick(100.0) is State.HALF_OPEN
    breaker.success(100.0, from_probe=True)
    assert breaker.state is State.CLOSED


def test_a_slow_replica_is_not_closed_by_a_health_probe_only_by_a_fast_trial() -> None:
    breaker = closed_breaker()
    breaker.success(1.0, slow=True)
    assert breaker.state is State.OPEN and breaker.reason is Reason.SLOW
    breaker.success(COOLDOWN + 1, from_probe=True)   # /health is as fast as ever
    assert breaker.state is State.HALF_OPEN
    assert breaker.attempt(COOLDOWN + 1)
    breaker.success(COOLDOWN + 2, slow=True)           # the trial: still slow
    assert breaker.state is State.OPEN
    assert breaker.attempt(2 * COOLDOWN + 2)
    breaker.success(2 * COOLDOWN + 3)                  # fast again
    assert breaker.state is State.CLOSED


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pool_of(replicas: list[FakeReplica], clock: Clock) -> ReplicaPool:
    backends = [(ReplicaSpec(id=r.name, url=f"http://{r.name}", model=r.model),
                 HttpxBackend(r.name, f"http://{r.name}", Timeouts(), transport=r.transport()))
                for r in replicas]
    return ReplicaPool(backends, clock=clock, cooldown=COOLDOWN,
                       slow=SlowSettings(factor=3.0, window=10, min_samples=5, min_ttft=0.1))


def answer(pool: ReplicaPool, replica_id: str, ttft: float, tokens: int = 500) -> None:
    """One request of ``tokens`` uncached tokens that ``replica_id`` answered in ``ttft``."""
    with pool.lease(replica_id, tokens) as lease:
        pool.report_first_byte(lease, ttft)


def routable(pool: ReplicaPool) -> set[str]:
    return {view.id for view in pool.snapshot() if view.healthy}


async def test_pool_takes_a_slow_replica_out_and_a_fast_trial_brings_it_back() -> None:
    clock = Clock()
    pool = pool_of([FakeReplica("a"), FakeReplica("b"), FakeReplica("c")], clock)
    for replica in pool:
        await pool.probe(replica)
    assert routable(pool) == {"a", "b", "c"}
    for _ in range(10):
        answer(pool, "a", 0.2)
        answer(pool, "b", 0.3)
        answer(pool, "c", 2.0)
    assert routable(pool) == {"a", "b"}
    assert not pool.get("c").healthy
    assert not pool.tripped("c")               # slow, not failing: waiting requests stay

    await pool.probe(pool.get("c"))
    clock.now += COOLDOWN
    await pool.probe(pool.get("c"))            # a good /health does not bring a slow one back
    assert routable(pool) == {"a", "b", "c"}   # but it is half-open: one trial may go
    with pool.lease("c", 500) as lease:
        assert routable(pool) == {"a", "b"}
        pool.report_first_byte(lease, 0.25)
    assert routable(pool) == {"a", "b", "c"} and pool.get("c").healthy
    await pool.aclose()


async def test_pool_opens_on_a_request_failure_and_the_probe_is_the_trial() -> None:
    clock = Clock()
    fake = FakeReplica("a")
    pool = pool_of([fake, FakeReplica("b")], clock)
    for replica in pool:
        await pool.probe(replica)
    pool.report_failure("a", "no first token within the first-byte timeout")
    assert routable(pool) == {"b"} and pool.tripped("a")
    await pool.probe(pool.get("a"))            # answers, but the cooldown is not over
    assert routable(pool) == {"b"}
    clock.now += COOLDOWN
    fake.up = False
    await pool.probe(pool.get("a"))            # the trial fails: open again
    clock.now += COOLDOWN - 0.1
    assert routable(pool) == {"b"}
    clock.now += 0.1
    fake.up = True
    await pool.probe(pool.get("a"))
    assert routable(pool) == {"a", "b"} and pool.get("a").healthy
    await pool.aclose()


async def test_pool_failed_probes_open_after_the_threshold() -> None:
    clock = Clock()
    fake = FakeReplica("a")
    pool = pool_of([fake], clock)
    await pool.probe(pool.get("a"))
    fake.up = False
    await pool.probe(pool.get("a"))
    assert pool.get("a").healthy
    await pool.probe(pool.get("a"))
    assert not pool.get("a").healthy and pool.tripped("a")
    await pool.aclose()


async def test_breaker_states_are_on_metrics() -> None:
    clock = Clock()
    pool = pool_of([FakeReplica("a"), FakeReplica("b")], clock)
    for replica in pool:
        await pool.probe(replica)
    pool.report_failure("b", "connection refused")
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in BreakerCollector(pool).collect() for s in family.samples}

    def state(replica: str, name: str) -> float:
        return samples[("prefixgate_replica_breaker_state",
                        (("replica", replica), ("state", name)))]

    assert state("a", "closed") == 1 and state("a", "open") == 0
    assert state("b", "open") == 1 and state("b", "closed") == 0
    assert samples[("prefixgate_replica_breaker_open_reason",
                    (("reason", "failing"), ("replica", "b")))] == 1
    assert samples[("prefixgate_replica_breaker_opened_total", (("replica", "b"),))] == 1
    await pool.aclose()
