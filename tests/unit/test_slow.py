"""The slow-replica detector: a replica is judged by its time for the work it was given."""

from __future__ import annotations

import random
import statistics

from engine.pool.slow import SlowDetector, SlowSettings


def detector(enabled: bool = True, window: int = 40) -> SlowDetector:
    return SlowDetector(SlowSettings(enabled=enabled, factor=3.0, window=window, min_samples=10,
                                     min_ttft=0.1))


def healthy_ttft(work: float, per_token: float = 1e-4, overhead: float = 0.02) -> float:
    return overhead + per_token * work


def feed(slow: SlowDetector, replica: str, works: list[float], per_token: float = 1e-4,
         overhead: float = 0.02) -> None:
    for work in works:
        slow.record(replica, healthy_ttft(work, per_token, overhead), work)


def mixed_work(rng: random.Random, count: int, low: int = 64, high: int = 4000) -> list[float]:
    """Hits and misses: the work a cache-aware fleet's requests bring."""
    return [float(rng.choice([rng.randint(low, 300), rng.randint(1000, high)]))
            for _ in range(count)]


def test_a_replica_ten_times_slower_per_token_is_slow_at_any_load() -> None:
    rng = random.Random(1)
    slow = detector()
    feed(slow, "a", mixed_work(rng, 40))
    feed(slow, "b", mixed_work(rng, 40))
    feed(slow, "c", mixed_work(rng, 40), per_token=1e-3, overhead=0.2)
    assert slow.is_slow("c", ["a", "b"])
    assert not slow.is_slow("a", ["b", "c"]) and not slow.is_slow("b", ["a", "c"])


def test_a_replica_a_burst_landed_on_is_slower_in_time_but_not_slow() -> None:
    rng = random.Random(2)
    slow = detector()
    feed(slow, "a", mixed_work(rng, 40))
    feed(slow, "b", mixed_work(rng, 40))
    # 40 requests queued behind each other: up to 2 s to the first token, ten times
    # what its peers take, all of it explained by the prefill queued ahead of each
    burst = [float(500 * (i + 1)) for i in range(40)]
    feed(slow, "c", burst)
    assert statistics.median(healthy_ttft(w) for w in burst) > 10 * statistics.median(
        healthy_ttft(w) for w in mixed_work(random.Random(2), 80))
    assert not slow.is_slow("c", ["a", "b"])


def test_a_replica_serving_only_hits_is_not_judged_by_the_misses_elsewhere() -> None:
    rng = random.Random(3)
    slow = detector()
    feed(slow, "a", [float(rng.randint(2000, 4000)) for _ in range(40)])   # misses: 0.2-0.4 s
    feed(slow, "b", [float(rng.randint(50, 100)) for _ in range(40)])      # hits: ~25 ms
    assert not slow.is_slow("a", ["b"]) and not slow.is_slow("b", ["a"])


def test_a_few_mispredicted_hits_do_not_make_a_replica_slow() -> None:
    rng = random.Random(4)
    slow = detector()
    feed(slow, "a", mixed_work(rng, 40))
    works = mixed_work(rng, 40)
    for i, work in enumerate(works):
        # a third of them predicted cached (64 tokens) but evicted: 3,000 to prefill
        actual = 3000.0 if i % 3 == 0 else work
        slow.record("b", healthy_ttft(actual), 64.0 if i % 3 == 0 else work)
    assert not slow.is_slow("b", ["a"])


def test_when_all_work_is_alike_it_is_the_plain_comparison_of_times() -> None:
    slow = detector()
    for replica, ttft in (("a", 0.2), ("b", 0.3), ("c", 0.7)):
        for _ in range(20):
            slow.record(replica, ttft, 500.0)
    assert not slow.is_slow("c", ["a", "b"])   # 0.7 <= 3 x 0.25
    for _ in range(40):
        slow.record("c", 1.0, 500.0)
    assert slow.is_slow("c", ["a", "b"])
    assert not slow.is_slow("a", ["b", "c"])


def test_it_needs_enough_samples_peers_and_a_median_above_the_floor() -> None:
    slow = detector()
    feed(slow, "a", [500.0] * 20)
    for _ in range(5):
        slow.record("b", 5.0, 500.0)
    assert not slow.is_slow("b", ["a"])        # too few samples
    for _ in range(10):
        slow.record("b", 5.0, 500.0)
    assert not slow.is_slow("b", [])           # no peer to compare with
    assert slow.is_slow("b", ["a"])
    tiny = detector()
    for _ in range(20):
        tiny.record("a", 0.001, 10.0)
        tiny.record("b", 0.05, 10.0)
    assert not tiny.is_slow("b", ["a"])        # 50x, but 50 ms is no one's problem
    off = detector(enabled=False)
    feed(off, "a", [500.0] * 20)
    for _ in range(20):
        off.record("b", 5.0, 500.0)
    assert not off.is_slow("b", ["a"])


def test_the_window_forgets_old_samples() -> None:
    slow = detector(window=10)
    feed(slow, "a", [500.0] * 10)
    for ttft in [5.0] * 10 + [healthy_ttft(500.0)] * 10:
        slow.record("b", ttft, 500.0)
    assert not slow.is_slow("b", ["a"])
    for _ in range(10):                         # and the slow ones push the fast out again
        slow.record("b", 5.0, 500.0)
    assert slow.is_slow("b", ["a"])
    slow.forget("b")
    for _ in range(10):
        slow.record("b", healthy_ttft(500.0), 500.0)
    assert not slow.is_slow("b", ["a"])
    slow.record("b", 5.0, 500.0)                  # one slow sample of ten: the median holds
    assert not slow.is_slow("b", ["a"])


def test_a_trial_is_judged_for_its_work_too() -> None:
    rng = random.Random(5)
    slow = detector()
    feed(slow, "a", mixed_work(rng, 40))
    assert not slow.trial_is_slow(healthy_ttft(20_000), 20_000, ["a"])   # 2 s: a long queue
    assert slow.trial_is_slow(10 * healthy_ttft(2_000), 2_000, ["a"])


def test_the_replicas_own_speed_is_measured() -> None:
    rng = random.Random(6)
    slow = detector()
    assert slow.seconds_per_token("a") is None
    feed(slow, "a", mixed_work(rng, 40), per_token=5e-4)
    speed = slow.seconds_per_token("a")
    assert speed is not None and abs(speed - 5e-4) < 1e-5
    # a replica with no spread of its own takes the fleet's
    for _ in range(20):
        slow.record("b", 0.5, 1000.0)
    assert slow.seconds_per_token("b") is not None
