"""The live linter's share of a core (``lint.cpu_share``)."""

from __future__ import annotations

from gateway.lint.budget import CpuBudget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_cpu_accrues_at_the_share_up_to_the_burst_and_is_charged() -> None:
    clock = Clock()
    budget = CpuBudget(0.1, wall=clock)  # 0.25 s of CPU at once
    assert budget.allows()
    for _ in range(3):
        budget.charge(0.1)                # three lints of 0.1 s
    assert not budget.allows()            # 0.05 s in debt
    clock.now += 0.25                     # +0.025 s: still in debt
    assert not budget.allows()
    clock.now += 0.5                      # +0.05 s
    assert budget.allows()
    clock.now += 3600                     # a quiet hour saves no more than the burst
    budget.allows()
    for _ in range(3):
        budget.charge(0.1)
    assert not budget.allows()


def test_one_slow_lint_does_not_stop_the_linter() -> None:
    clock = Clock()
    budget = CpuBudget(0.1, wall=clock)
    budget.charge(30.0)                   # a first lint that warmed everything up
    assert budget.allows()                # charged half a burst
    budget.charge(30.0)
    assert not budget.allows()            # but many are paced
    clock.now += 0.1
    assert budget.allows()


def test_no_share_is_no_limit() -> None:
    budget = CpuBudget(0)
    budget.charge(1e6)
    assert budget.allows()
